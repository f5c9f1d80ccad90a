//! `memc run --device cuda --profile`: one step's device time by op, as a table.

use memc::plan::Plan;

/// The profiled step's device time by op: the total, then the ops (by name) that took
/// longest, each with its share, its plan steps and milliseconds.
pub(super) fn table(plan: &Plan, times: &[(usize, f64)], launches: (u64, u64)) -> String {
    let total: f64 = times.iter().map(|t| t.1).sum();
    let mut by_op: Vec<(&str, usize, f64)> = Vec::new();
    for &(s, ms) in times {
        let name = plan.steps[s].op.name();
        match by_op.iter_mut().find(|o| o.0 == name) {
            Some(o) => {
                o.1 += 1;
                o.2 += ms;
            }
            None => by_op.push((name, 1, ms)),
        }
    }
    by_op.sort_by(|a, b| b.2.total_cmp(&a.2));
    let mut out = format!(
        "cuda profile: {total:.3} ms of device work in one step ({} kernel launches, {} library calls)\n",
        launches.0, launches.1
    );
    for (name, steps, ms) in by_op.iter().take(15) {
        out.push_str(&format!(
            "  {ms:10.3} ms {:5.1}%  {name} ({steps} steps)\n",
            100.0 * ms / total.max(f64::MIN_POSITIVE)
        ));
    }
    out
}
