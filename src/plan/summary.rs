//! The report's opening lines for someone who hit out-of-memory: what the step needs, what
//! the bytes live at its peak are, what shrinks the largest of them, and where to compare
//! every option.

use super::peak::{clipped, live_at_peak};
use super::{human_bytes, BufferClass, Plan, Role};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Writes the summary lines of `plan`'s report.
pub(super) fn render(out: &mut String, plan: &Plan) {
    let mut by_class: BTreeMap<BufferClass, u64> = BTreeMap::new();
    for b in live_at_peak(plan) {
        *by_class.entry(b.class).or_default() += b.bytes;
    }
    let mut parts: Vec<(BufferClass, u64)> = by_class.into_iter().collect();
    parts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let listed: Vec<String> = parts
        .iter()
        .take(3)
        .map(|&(class, bytes)| format!("{} {}", class.label(), human_bytes(bytes)))
        .collect();
    let host = plan.report.host.map_or(String::new(), |h| {
        format!(", and {} of host memory", human_bytes(h.arena))
    });
    let _ = writeln!(
        out,
        "  needs {} for the step (its arena){host}; live at the peak: {}",
        human_bytes(plan.report.bytes.arena),
        listed.join(", ")
    );
    if let Some(d) = plan.report.device {
        let (nccl, what) = match d.nccl_reserve {
            0 => (String::new(), "a stated figure"),
            n => (
                format!(" and NCCL's {} per rank", human_bytes(n)),
                "stated figures",
            ),
        };
        let _ = writeln!(
            out,
            "  on the GPU: {} with the CUDA context's {}{nccl} ({what}, --context-reserve; the arena is what the plan guarantees)",
            human_bytes(d.total),
            human_bytes(d.context_reserve)
        );
    }
    saved_by_line(out, plan);
    if let Some(&(largest, _)) = parts.first() {
        let _ = writeln!(out, "  to need less: {}", hint(plan, largest));
    }
    let _ = writeln!(
        out,
        "  compare every option as compiled plans: memc advise FILE --budget SIZE"
    );
}

/// The `.mdl` lines whose activations backward keeps the most bytes of, up to two, with
/// their text: what to look at first when activations dominate.
fn saved_by_line(out: &mut String, plan: &Plan) {
    let listed: Vec<String> = plan
        .bytes_by_line(|b| b.role == Some(Role::SavedActivation))
        .into_iter()
        .filter_map(|(line, bytes, count)| {
            let line = line?;
            let text = plan.source_lines.get(&line).map_or("", String::as_str);
            let s = if count == 1 { "" } else { "s" };
            Some(format!(
                "line {line} ({}): {} in {count} tensor{s}",
                clipped(text, 48),
                human_bytes(bytes)
            ))
        })
        .take(2)
        .collect();
    if !listed.is_empty() {
        let _ = writeln!(
            out,
            "  activations kept for backward, the most from {}",
            listed.join("; ")
        );
    }
}

/// What shrinks the bytes of `class` in `plan`.
fn hint(plan: &Plan, class: BufferClass) -> &'static str {
    let training = plan.train.is_some();
    let low_precision = plan.report.precision.is_some();
    let fp32_weights = plan
        .buffers
        .iter()
        .any(|b| b.class == BufferClass::Param && b.ty.dtype == crate::ir::DType::F32);
    // Frozen weights stored unquantized, against all parameter bytes.
    let unquantized_frozen: u64 = (plan.params.iter())
        .filter(|p| p.grad.is_none() && p.quant.is_none())
        .map(|p| plan.buffers[p.buffer.index()].ty.bytes())
        .sum();
    let frozen_dominate = training && 2 * unquantized_frozen > plan.report.bytes.params;
    match class {
        BufferClass::Param if frozen_dominate => {
            "--quantize-frozen nf4 stores the frozen weights in about 4.1 bits each (QLoRA; int8: 8)"
        }
        BufferClass::Activation if training && !low_precision => {
            "--precision bf16 halves activations; --checkpoint block or first=K (or a --budget) recomputes them instead of keeping them for backward"
        }
        BufferClass::Activation if training => {
            "--checkpoint block or first=K (or a --budget) recomputes activations instead of keeping them for backward"
        }
        BufferClass::OptimState => {
            "AdamW keeps 8 bytes per parameter in fp32, about 2 with --optimizer-state int8 (8-bit moments); SGD with momentum 4, without none (train { optimizer = sgd(...) }); --offload optimizer keeps it in host memory"
        }
        BufferClass::Param if training && fp32_weights => {
            "--precision bf16 --master-weights off stores parameters in bf16 (2 bytes each)"
        }
        BufferClass::Gradient => {
            "the optimizer in backward (the default without clipping) frees each gradient after its update"
        }
        BufferClass::Temporary if training => {
            "backward temporaries scale with the batch (--set B=...); gradient accumulation (--accumulate N) keeps the batch"
        }
        _ => "a smaller batch (--set B=...)",
    }
}
