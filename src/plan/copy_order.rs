//! The order between the CUDA backend's two streams for a plan with a host tier
//! (`--offload`): kernels run on the compute stream, copies between the arena and the pinned
//! host arena on a copy stream, so a copy overlaps the kernels around it.
//!
//! A device step conflicts with a copy over the copy's device bytes where one of them
//! writes those bytes: a copy to the host only reads them, so it conflicts with the steps
//! that write them (its source's producer, and the step that reuses the bytes), while a
//! copy into the device conflicts with every step that reads or writes them. Each copy
//! waits only for the last earlier device step it conflicts with, so it starts as soon as
//! its bytes are ready or free, however far the kernels issued before it have got; the
//! compute stream waits for a copy only before the first later device step that conflicts
//! with it. So a saved activation's copy to the host runs beside the kernels that still
//! read it until its bytes are reused, and a prefetch runs from the moment its bytes are
//! free until its first reader. Copies follow one another on their own stream, and host steps run on it
//! between them, so neither needs more. A micro-step's copies start after the work of the
//! micro-step before, and what a micro-step leaves in flight is waited for at its end.

use crate::plan::{Placement, Plan, Step};
use std::ops::Range;

/// The device bytes a copy between the tiers moves: the device buffer it reads
/// (`copy_to_host`) or writes (`copy_to_device`, `copy_from_host`); None for any other step.
pub fn copied_device_bytes(plan: &Plan, step: &Step) -> Option<Range<u64>> {
    let device = match step.op {
        crate::ir::Op::CopyToHost | crate::ir::Op::CopyToDevice => step.inputs.first(),
        crate::ir::Op::CopyFromHost => step.output.as_ref(),
        _ => None,
    }?;
    plan.buffers.get(device.index()).map(bytes_of)
}

fn bytes_of(b: &crate::plan::Buffer) -> Range<u64> {
    b.offset..b.offset + b.bytes.max(b.ty.bytes())
}

/// The device bytes a device step touches: with `reads`, its inputs, output and workspace;
/// without, only what it writes (its output, workspace and the inputs it updates in place).
/// None for a step that launches nothing (a view).
fn touched(plan: &Plan, step: &Step, reads: bool) -> Vec<Range<u64>> {
    if plan.placement(step) != Placement::Device || !plan.launches(step) {
        return Vec::new();
    }
    let mutated = step.op.mutated_inputs();
    let inputs = (step.inputs.iter().enumerate())
        .filter(|(i, _)| reads || mutated.contains(i))
        .map(|(_, b)| b);
    (inputs.chain(&step.output).chain(&step.workspace))
        .filter_map(|b| plan.buffers.get(b.index()))
        .map(bytes_of)
        .collect()
}

fn overlap(a: &Range<u64>, b: &Range<u64>) -> bool {
    a.start < b.end && b.start < a.end
}

/// The two directions of the order between the streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyOrder {
    /// Per plan step, the copy steps the compute stream waits for before issuing it: each
    /// copy appears once, before the first later device step touching its device bytes (a
    /// copy no later step touches is waited for at the micro-step's end instead).
    pub compute_waits: Vec<Vec<usize>>,
    /// Per copy step, the last earlier device step touching its device bytes, which the copy
    /// waits for (None: no step of the micro-step before it touches them; None for every
    /// other step).
    pub copy_waits: Vec<Option<usize>>,
}

/// The order between the compute stream and the copy stream for `plan` (module doc).
pub fn copy_order(plan: &Plan) -> CopyOrder {
    let touches = |reads| -> Vec<Vec<Range<u64>>> {
        (plan.steps.iter())
            .map(|s| touched(plan, s, reads))
            .collect()
    };
    let (all, writes) = (touches(true), touches(false));
    let conflict = |c: usize, t: usize, moved: &Range<u64>| {
        // A copy to the host only reads its device bytes: reading them beside it is no
        // conflict. A copy into the device conflicts with every touch.
        let touched = match plan.steps[c].op {
            crate::ir::Op::CopyToHost => &writes[t],
            _ => &all[t],
        };
        touched.iter().any(|r| overlap(r, moved))
    };
    let mut order = CopyOrder {
        compute_waits: vec![Vec::new(); plan.steps.len()],
        copy_waits: vec![None; plan.steps.len()],
    };
    for (c, step) in plan.steps.iter().enumerate() {
        let Some(moved) = copied_device_bytes(plan, step) else {
            continue;
        };
        order.copy_waits[c] = (0..c).rev().find(|&t| conflict(c, t, &moved));
        if let Some(t) = (c + 1..plan.steps.len()).find(|&t| conflict(c, t, &moved)) {
            order.compute_waits[t].push(c);
        }
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offloaded(offload: &str) -> Plan {
        let source =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/gpt2.mdl"))
                .expect("the example exists");
        let mut options = crate::Options::default();
        for (k, v) in [
            ("B", 2),
            ("T", 16),
            ("D", 32),
            ("H", 2),
            ("L", 2),
            ("V", 64),
        ] {
            options.overrides.push((k.to_string(), v));
        }
        options.precision = Some(crate::settings::Precision::Bf16);
        options.target = crate::plan::Target::Cuda { sm: (8, 0) };
        options.offload = Some(crate::settings::Offload::parse(offload).expect("a known offload"));
        crate::compile(&source, &options)
            .expect("the small GPT-2 compiles")
            .plan
            .plan()
            .clone()
    }

    /// Whether device step `t` conflicts with copy step `c` over its device bytes `moved`:
    /// a write to them for a copy to the host, any touch for a copy into the device.
    fn conflicts(plan: &Plan, c: usize, t: usize, moved: &Range<u64>) -> bool {
        let reads = plan.steps[c].op != crate::ir::Op::CopyToHost;
        let touches = touched(plan, &plan.steps[t], reads);
        touches.iter().any(|r| overlap(r, moved))
    }

    /// Every device step that conflicts with a copy over its device bytes comes after a wait
    /// on that copy (at it or at an earlier step after the copy), no step waits for a copy
    /// it does not conflict with, and each copy waits for the last earlier step it conflicts
    /// with.
    #[test]
    fn every_step_conflicting_with_a_copy_is_ordered_after_it() {
        for offload in ["optimizer", "activations", "all"] {
            let plan = offloaded(offload);
            let order = copy_order(&plan);
            let waits = &order.compute_waits;
            let mut copies = 0;
            for (c, step) in plan.steps.iter().enumerate() {
                let Some(moved) = copied_device_bytes(&plan, step) else {
                    continue;
                };
                copies += 1;
                let earlier = (0..c).filter(|&t| conflicts(&plan, c, t, &moved));
                assert_eq!(order.copy_waits[c], earlier.max(), "{offload}: copy {c}");
                let mut waited = false;
                for (t, list) in waits.iter().enumerate().skip(c + 1) {
                    waited |= list.contains(&c);
                    if conflicts(&plan, c, t, &moved) {
                        assert!(
                            waited,
                            "{offload}: step {t} conflicts with copy {c} unordered"
                        );
                    }
                }
            }
            assert!(copies > 0, "{offload}: the plan copies");
            for (t, list) in waits.iter().enumerate() {
                for &c in list {
                    let moved = copied_device_bytes(&plan, &plan.steps[c]).expect("a copy");
                    assert!(c < t && conflicts(&plan, c, t, &moved));
                }
            }
        }
    }

    /// The copies of `offload = activations` overlap kernels: a saved activation's copy to
    /// the host runs beside the kernels that still read it, and a prefetch starts once its
    /// bytes are free, before its place.
    #[test]
    fn copies_overlap_the_kernels_around_them() {
        let plan = offloaded("activations");
        let order = copy_order(&plan);
        let kernel = |u: usize| !touched(&plan, &plan.steps[u], true).is_empty();
        let early = (plan.steps.iter().enumerate())
            .filter(|(_, s)| s.op == crate::ir::Op::CopyFromHost)
            .filter(|&(c, _)| {
                let free_since = order.copy_waits[c].map_or(0, |t| t + 1);
                (free_since..c).any(kernel)
            })
            .count();
        assert!(early > 0, "no prefetch starts before its place");
        let copies_out = (plan.steps.iter().enumerate())
            .filter(|(_, s)| s.op == crate::ir::Op::CopyToHost)
            .map(|(c, _)| c);
        let waited_at = |c: usize| {
            (order.compute_waits.iter())
                .position(|list| list.contains(&c))
                .unwrap_or(plan.steps.len())
        };
        let overlapped = copies_out
            .filter(|&c| (c + 1..waited_at(c)).any(kernel))
            .count();
        assert!(overlapped > 0, "no copy to the host overlaps a kernel");
    }
}
