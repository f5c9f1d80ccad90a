//! Buffer lifetimes from a schedule: the step interval over which each value's storage is
//! live. Parameters and optimizer state live over the whole step, inputs from the first step
//! to their last reader, computed values from their producer to their last reader, and the
//! step's outputs to the end.

use super::schedule::Schedule;
use crate::ir::{Graph, Op, ValueId};

/// An inclusive range of step indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    pub first: usize,
    pub last: usize,
}

/// Lifetimes per value (indexed by value id); `None` for values no step touches.
pub fn run(graph: &Graph, schedule: &Schedule) -> Vec<Option<Interval>> {
    let steps = schedule.order.len();
    let end = steps.saturating_sub(1);
    let mut position = vec![usize::MAX; graph.len()];
    for (i, &v) in schedule.order.iter().enumerate() {
        position[v.index()] = i;
    }
    let mut last_use = vec![None::<usize>; graph.len()];
    for &v in &schedule.order {
        for &i in &graph.node(v).inputs {
            let p = position[v.index()];
            let slot = &mut last_use[i.index()];
            *slot = Some(slot.map_or(p, |q: usize| q.max(p)));
        }
    }
    let outputs: Vec<ValueId> = graph.outputs.iter().map(|&(_, v)| v).collect();
    graph
        .values()
        .map(|v| {
            let used = last_use[v.index()];
            match graph.node(v).op {
                Op::Param { .. } | Op::OptimState { .. } => Some(Interval {
                    first: 0,
                    last: end,
                }),
                // An input the step also returns must still hold it when the step ends.
                Op::Input { .. } if outputs.contains(&v) => Some(Interval {
                    first: 0,
                    last: end,
                }),
                Op::Input { .. } => used.map(|last| Interval { first: 0, last }),
                _ => {
                    let first = position[v.index()];
                    if first == usize::MAX {
                        return None;
                    }
                    let last = if outputs.contains(&v) {
                        end
                    } else {
                        used.unwrap_or(first)
                    };
                    Some(Interval { first, last })
                }
            }
        })
        .collect()
}
