//! The 1F1B order of a stage's steps (PipeDream-Flush, Megatron-LM's default schedule):
//! stage `s` of `P` runs `w = min(P - s - 1, M)` warm-up forwards, then alternates one
//! forward and one backward, then runs the remaining backwards, so at most
//! `min(P - s, M)` micro-batches' saved activations are live at once. The schedule
//! ([`crate::passes::schedule`]) takes each step's slot in that sequence as its first
//! priority, so among ready steps the earliest slot runs first.

use crate::ir::{Graph, Op, Phase};

/// A stage's place in the 1F1B schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OneFOneB {
    /// Warm-up forwards before the first backward: `min(P - s - 1, M)`.
    pub warmup: u32,
    /// Micro-batches per step.
    pub micro: u32,
}

impl OneFOneB {
    /// Stage `stage` of `stages`, over `micro` micro-batches.
    pub fn new(stage: u32, stages: u32, micro: u32) -> OneFOneB {
        OneFOneB {
            warmup: stages.saturating_sub(stage + 1).min(micro),
            micro,
        }
    }

    /// The slot of micro-batch `m`'s forward (`backward` false) or backward in the 1F1B
    /// sequence.
    pub fn slot(&self, m: u32, backward: bool) -> u32 {
        let (w, n) = (self.warmup, self.micro);
        match backward {
            false if m < w => m,
            false => w + 2 * (m - w),
            true if m < n - w => w + 2 * m + 1,
            true => n + m,
        }
    }

    /// Every value's slot (by index): the slot of the micro-batch it belongs to in its
    /// phase; update steps after every micro-batch; values of no micro-batch (parameter
    /// casts, the gradient seed) slot 0. A value belongs to the micro-batch of a send or
    /// receive it is (a parameter sent with each micro-batch goes with it), of the input
    /// rows it slices, or else the latest one among its inputs'.
    pub fn slots(&self, graph: &Graph) -> Vec<u32> {
        let mut micro: Vec<Option<u32>> = vec![None; graph.len()];
        for v in graph.values() {
            let node = graph.node(v);
            micro[v.index()] = match &node.op {
                Op::PipelineRecv { link, .. } | Op::PipelineSend(link) => Some(link.micro),
                Op::Slice { start, end, .. }
                    if node
                        .inputs
                        .first()
                        .is_some_and(|&i| matches!(graph.node(i).op, Op::Input { .. })) =>
                {
                    Some((start / (end - start).max(1)) as u32)
                }
                _ => node.inputs.iter().filter_map(|i| micro[i.index()]).max(),
            };
        }
        graph
            .values()
            .map(|v| match (graph.node(v).phase, micro[v.index()]) {
                (Phase::Update, _) => 2 * self.micro,
                (_, None) => 0,
                (phase, Some(m)) => self.slot(m, phase == Phase::Backward),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stage 0 of 2 over 4 micro-batches: F0 F1 B0 F2 B1 F3 B2 B3; the last stage
    /// alternates from the start; stage 0 of 4 over 2 runs both forwards first.
    #[test]
    fn slots_follow_one_forward_one_backward() {
        let order = |o: OneFOneB| {
            let mut slots: Vec<(u32, String)> = (0..o.micro)
                .flat_map(|m| {
                    [
                        (o.slot(m, false), format!("F{m}")),
                        (o.slot(m, true), format!("B{m}")),
                    ]
                })
                .collect();
            slots.sort();
            slots
                .into_iter()
                .map(|(_, s)| s)
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(order(OneFOneB::new(0, 2, 4)), "F0 F1 B0 F2 B1 F3 B2 B3");
        assert_eq!(order(OneFOneB::new(1, 2, 4)), "F0 B0 F1 B1 F2 B2 F3 B3");
        assert_eq!(order(OneFOneB::new(0, 4, 2)), "F0 F1 B0 B1");
    }
}
