//! `memc fit --ranks`: prints the fewest ranks, the ZeRO stage and the tensor split whose
//! per-rank plan fits the budget, every layout tried, and the plan's report.

use super::{output, Failure, Format};
use memc::fit_ranks::{fewest_ranks, RankProbe, RanksFitError};
use memc::plan::{grouped, human_bytes};
use std::fmt::Write;

/// Runs the search over `src` compiled with `opts`, `budget` bytes per device and at most
/// `max` ranks, and prints the answer as `format` says.
pub(super) fn fit(
    src: &str,
    opts: &memc::Options,
    (budget, max): (u64, u32),
    format: Format,
) -> Result<(), Failure> {
    let found = match fewest_ranks(src, opts, budget, max) {
        Ok(found) => found,
        Err(RanksFitError::Internal(errs)) => return Err(Failure::Internal(errs)),
        Err(RanksFitError::Infeasible { max_ranks, probes }) => {
            return Err(Failure::Plain(format!(
                "no parallel layout of up to {max_ranks} ranks fits {} per device:\n{}",
                human_bytes(budget),
                lines(&probes)
            )))
        }
    };
    let (p, plan) = (found.parallel, found.plan.plan());
    let bytes = plan.report.budgeted_bytes();
    let flag = format!("data={},zero={},tensor={}", p.data, p.zero, p.tensor);
    let text = if format == Format::Json {
        super::fit::to_json(serde_json::json!({
            "data": p.data,
            "zero": p.zero,
            "tensor": p.tensor,
            "flags": ["--parallel", flag],
            "budget": budget,
            "bytes_per_rank": bytes,
            "tried": found.probes.iter().map(|t| serde_json::json!({
                "data": t.data,
                "zero": t.zero,
                "tensor": t.tensor,
                "bytes": t.bytes,
                "refusal": t.refusal,
            })).collect::<Vec<_>>(),
            "report": plan.report,
        }))?
    } else {
        let mut out = format!(
            "fit ranks: the fewest within {} per device is data = {}, ZeRO-{}, tensor = {} (--parallel {flag}): {} ({} bytes) per rank\n{}",
            human_bytes(budget),
            p.data,
            p.zero,
            p.tensor,
            human_bytes(bytes),
            grouped(bytes),
            lines(&found.probes)
        );
        out.push_str(&memc::plan::render_text(plan));
        out
    };
    output::write(None, &text)
}

/// One line per layout tried: fits with its bytes, or the compiler's refusal.
fn lines(probes: &[RankProbe]) -> String {
    let mut out = String::new();
    for t in probes {
        let verdict = match (t.bytes, &t.refusal) {
            (Some(b), _) => format!("fits: {}", human_bytes(b)),
            (None, Some(why)) => format!("does not fit: {why}"),
            (None, None) => "does not fit".into(),
        };
        let _ = writeln!(
            out,
            "  data = {:>4}, ZeRO-{}, tensor = {}: {verdict}",
            t.data, t.zero, t.tensor
        );
    }
    out
}
