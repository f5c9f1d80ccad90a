//! `memc compile --summary`: the plan's memory in the shape of PyTorch's
//! `torch.cuda.memory_summary()`, for people who read that table: allocated bytes that
//! outlive the step (parameters and optimizer state), at its peak, allocated in all and freed
//! within it, in all and by role; the arena as the reserved memory (with the CUDA context on
//! a GPU); and the same for the number of buffers.

use super::peak::live_at_peak;
use super::{human_bytes, Buffer, BufferClass, Plan};
use std::fmt::Write;

/// The roles in the table's order.
const CLASSES: [BufferClass; 7] = [
    BufferClass::Param,
    BufferClass::Gradient,
    BufferClass::OptimState,
    BufferClass::Activation,
    BufferClass::Temporary,
    BufferClass::Input,
    BufferClass::Workspace,
];

/// Bytes and buffer counts of one row: at the end of the step, at its peak, in all.
#[derive(Default, Clone, Copy)]
struct Row {
    end: (u64, u64),
    peak: (u64, u64),
    all: (u64, u64),
}

impl Row {
    fn add(&mut self, b: &Buffer, at_end: bool, at_peak: bool) {
        let one = |t: &mut (u64, u64), yes: bool| {
            if yes {
                t.0 += b.bytes;
                t.1 += 1;
            }
        };
        one(&mut self.end, at_end);
        one(&mut self.peak, at_peak);
        one(&mut self.all, true);
    }
}

/// The table for `plan`.
pub fn render_memory_summary(plan: &Plan) -> String {
    let mut at_peak = vec![false; plan.buffers.len()];
    for b in live_at_peak(plan) {
        at_peak[b.id.index()] = true;
    }
    let mut total = Row::default();
    let mut by_class = [Row::default(); CLASSES.len()];
    for b in plan
        .buffers
        .iter()
        .filter(|b| b.view_of.is_none() && b.tier.is_device() && b.bytes > 0)
    {
        // What outlives the step: parameters and optimizer state.
        let (end, peak) = (b.class.is_persistent(), at_peak[b.id.index()]);
        total.add(b, end, peak);
        if let Some(i) = CLASSES.iter().position(|&c| c == b.class) {
            by_class[i].add(b, end, peak);
        }
    }
    let rule = format!("|{}|\n", "-".repeat(79));
    let heavy = format!("|{}|\n", "=".repeat(79));
    let mut out = heavy.clone();
    let title = format!("memc memory summary: {}", plan.model);
    let _ = writeln!(out, "|{title:^79}|");
    out.push_str(&rule);
    let _ = writeln!(
        out,
        "| {:<77} |",
        "one step: each buffer at a fixed offset in one arena, allocated once; freed"
    );
    let _ = writeln!(
        out,
        "| {:<77} |",
        "bytes are reused within the step, none go back to the device, none fragment"
    );
    out.push_str(&heavy);
    let _ = writeln!(
        out,
        "| {:<24}| {:>12} | {:>12} | {:>12} | {:>10} |",
        "Metric", "End of step", "At peak", "Tot alloc", "Tot freed"
    );
    out.push_str(&rule);
    let bytes_row = |out: &mut String, name: &str, r: &Row| {
        let freed = r.all.0 - r.end.0;
        let h = |v: u64| human_bytes(v);
        let _ = writeln!(
            out,
            "| {name:<24}| {:>12} | {:>12} | {:>12} | {:>10} |",
            h(r.end.0),
            h(r.peak.0),
            h(r.all.0),
            h(freed)
        );
    };
    bytes_row(&mut out, "Allocated memory", &total);
    for (class, row) in CLASSES.iter().zip(&by_class).filter(|(_, r)| r.all.1 > 0) {
        bytes_row(&mut out, &format!("      {}", class.label()), row);
    }
    out.push_str(&rule);
    let arena = plan.arena_bytes;
    let arena_h = human_bytes(arena);
    let _ = writeln!(
        out,
        "| {:<24}| {arena_h:>12} | {arena_h:>12} | {arena_h:>12} | {:>10} |",
        "Reserved memory (arena)",
        human_bytes(0)
    );
    if let Some(d) = plan.report.device {
        let mut reserves = vec![("+ CUDA context (stated)", d.context_reserve)];
        if d.nccl_reserve > 0 {
            reserves.push(("+ NCCL (stated)", d.nccl_reserve));
        }
        for (name, bytes) in reserves {
            let reserve = human_bytes(bytes);
            let _ = writeln!(
                out,
                "| {name:<24}| {reserve:>12} | {reserve:>12} | {reserve:>12} | {:>10} |",
                human_bytes(0)
            );
        }
    }
    out.push_str(&rule);
    let counts = |out: &mut String, name: &str, r: &Row| {
        let _ = writeln!(
            out,
            "| {name:<24}| {:>12} | {:>12} | {:>12} | {:>10} |",
            r.end.1,
            r.peak.1,
            r.all.1,
            r.all.1 - r.end.1
        );
    };
    counts(&mut out, "Allocations (buffers)", &total);
    out.push_str(&heavy);
    super::host::render(&mut out, &plan.report);
    super::unified::render(&mut out, plan);
    out
}
