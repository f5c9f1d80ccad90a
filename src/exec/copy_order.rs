//! The order between the CUDA backend's two streams for a plan with a host tier
//! (`--offload`): kernels run on the compute stream, copies between the arena and the pinned
//! host arena on a copy stream, so a copy overlaps the kernels that follow it until one of
//! them touches the device bytes it moves.
//!
//! Each copy waits only for the last earlier device step whose buffers overlap the device
//! bytes it moves (a saved activation's producer, a prefetch's previous occupant's last
//! reader), so it starts as soon as its bytes are free, however far the kernels issued
//! before it have got. The compute stream waits for a copy only before the first later
//! device step whose buffers overlap the copy's device bytes: a saved activation copied out
//! keeps its bytes until the step that reuses them, a prefetched one is waited for by its
//! first reader. Copies follow one another on their own stream, and host steps run on it
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

/// The device bytes a device step reads or writes: its inputs, output and workspace (none
/// for a step that launches nothing, a view).
fn touched(plan: &Plan, step: &Step) -> Vec<Range<u64>> {
    if plan.placement(step) != Placement::Device || !plan.launches(step) {
        return Vec::new();
    }
    (step
        .inputs
        .iter()
        .chain(&step.output)
        .chain(&step.workspace))
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
    let touches: Vec<Vec<Range<u64>>> = plan.steps.iter().map(|s| touched(plan, s)).collect();
    let touch = |t: usize, moved: &Range<u64>| touches[t].iter().any(|r| overlap(r, moved));
    let mut order = CopyOrder {
        compute_waits: vec![Vec::new(); plan.steps.len()],
        copy_waits: vec![None; plan.steps.len()],
    };
    for (c, step) in plan.steps.iter().enumerate() {
        let Some(moved) = copied_device_bytes(plan, step) else {
            continue;
        };
        order.copy_waits[c] = (0..c).rev().find(|&t| touch(t, &moved));
        if let Some(t) = (c + 1..plan.steps.len()).find(|&t| touch(t, &moved)) {
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

    /// Every device step that touches a copy's device bytes comes after a wait on that copy
    /// (at it or at an earlier step after the copy), and no step waits for a copy without
    /// touching its bytes.
    #[test]
    fn every_step_touching_copied_bytes_is_ordered_after_the_copy() {
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
                // The copy waits for the last earlier step touching its bytes.
                let earlier = (0..c).filter(|&t| {
                    let touches = touched(&plan, &plan.steps[t]);
                    touches.iter().any(|r| overlap(r, &moved))
                });
                assert_eq!(order.copy_waits[c], earlier.max(), "{offload}: copy {c}");
                let mut waited = false;
                for (t, later) in plan.steps.iter().enumerate().skip(c + 1) {
                    waited |= waits[t].contains(&c);
                    let touches = touched(&plan, later);
                    if touches.iter().any(|r| overlap(r, &moved)) {
                        assert!(
                            waited,
                            "{offload}: step {t} touches copy {c}'s bytes unordered"
                        );
                    }
                }
            }
            assert!(copies > 0, "{offload}: the plan copies");
            for (t, list) in waits.iter().enumerate() {
                for &c in list {
                    let moved = copied_device_bytes(&plan, &plan.steps[c]).expect("a copy");
                    assert!(c < t);
                    assert!(touched(&plan, &plan.steps[t])
                        .iter()
                        .any(|r| overlap(r, &moved)));
                }
            }
        }
    }

    /// A prefetched activation is waited for by its first reader, not at the copy, and the
    /// prefetch starts once its bytes are free, not when the kernels reach it: the copies of
    /// `offload = activations` leave device steps between each copy and its wait, and
    /// prefetches start device steps before their place.
    #[test]
    fn copies_overlap_the_steps_before_their_first_reader() {
        let plan = offloaded("activations");
        let order = copy_order(&plan);
        let early = (plan.steps.iter().enumerate())
            .filter(|(_, s)| s.op == crate::ir::Op::CopyFromHost)
            .filter(|&(c, _)| {
                let free_since = order.copy_waits[c].map_or(0, |t| t + 1);
                (free_since..c).any(|u| !touched(&plan, &plan.steps[u]).is_empty())
            })
            .count();
        assert!(early > 0, "no prefetch starts before its place");
        let waits = &order.compute_waits;
        let overlapped = waits
            .iter()
            .enumerate()
            .flat_map(|(t, list)| list.iter().map(move |&c| (c, t)))
            .filter(|&(c, t)| (c + 1..t).any(|u| !touched(&plan, &plan.steps[u]).is_empty()))
            .count();
        assert!(overlapped > 0, "no copy overlaps a kernel");
    }
}
