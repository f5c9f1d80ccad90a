//! The execution order: a topological order of the graph's compute nodes, kept apart from
//! the graph. In-place updates run after every other reader of what they overwrite. With the
//! optimizer in backward, each update runs as soon as its gradient is complete, so that
//! gradient dies at once; otherwise all updates wait until the whole backward is done.

use super::StageError;
use crate::ir::{Graph, Op, OpClass, Phase, ValueId};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Scheduling choices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduleOptions {
    pub optimizer_in_backward: bool,
    /// A pipeline stage's 1F1B place: its slots come first among ready steps.
    pub pipeline: Option<super::pipeline::order::OneFOneB>,
}

/// An order of every non-source node (sources are bound before the first step).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    pub order: Vec<ValueId>,
}

/// Whether a node is a step (sources are not).
pub fn is_step(graph: &Graph, v: ValueId) -> bool {
    graph.node(v).op.class() != OpClass::Source
}

/// Whether step `u` takes value `i` at one of the input positions `slots` gives for its op.
fn takes_at(graph: &Graph, u: ValueId, i: ValueId, slots: fn(&Op) -> &'static [usize]) -> bool {
    let node = graph.node(u);
    slots(&node.op).iter().any(|&s| node.inputs[s] == i)
}

/// Whether step `w` writes value `i` in place.
fn writes(graph: &Graph, w: ValueId, i: ValueId) -> bool {
    takes_at(graph, w, i, Op::mutated_inputs)
}

/// Whether step `u` reads value `i` only after its in-place writers ([`Op::reads_after_writers`]).
fn reads_after_writers(graph: &Graph, u: ValueId, i: ValueId) -> bool {
    takes_at(graph, u, i, Op::reads_after_writers)
}

/// Dependencies of `v`: its inputs; for in-place steps, every other reader, in the same or an
/// earlier phase, of the values it overwrites (but those that read it after its writers);
/// and every in-place writer, in an earlier phase (or in the same phase, for an input `v`
/// reads after its writers), of a value `v` reads (gradient accumulation writes its
/// accumulator in backward, the update reads it after; an offloaded update writes the host
/// parameter that its copy back to the device then reads). A copy of a parameter to the
/// host also waits for the other inputs of its readers.
fn dependencies(graph: &Graph, users: &[Vec<ValueId>], v: ValueId) -> Vec<ValueId> {
    let node = graph.node(v);
    let mut deps: Vec<ValueId> = node.inputs.clone();
    for &slot in node.op.mutated_inputs() {
        let i = node.inputs[slot];
        deps.extend(users[i.index()].iter().copied().filter(|&u| {
            u != v && graph.node(u).phase <= node.phase && !reads_after_writers(graph, u, i)
        }));
    }
    for (slot, &i) in node.inputs.iter().enumerate() {
        let after = node.op.reads_after_writers().contains(&slot);
        deps.extend(users[i.index()].iter().copied().filter(|&w| {
            let phase = graph.node(w).phase;
            w != v && (phase < node.phase || (after && phase == node.phase)) && writes(graph, w, i)
        }));
    }
    if matches!(node.op, Op::CopyToHost)
        && matches!(graph.node(node.inputs[0]).op, Op::Param { .. })
    {
        // A parameter's host copy waits for its readers' other inputs (the gradient's
        // copy), so it lives no longer than they need it.
        for &u in &users[v.index()] {
            deps.extend(graph.node(u).inputs.iter().copied().filter(|&w| w != v));
        }
    }
    deps.retain(|&d| is_step(graph, d));
    deps.sort();
    deps.dedup();
    deps
}

/// Computes the order. Among ready nodes, update-phase steps (updates and, offloaded, their
/// copies) come first when the optimizer runs in backward; otherwise they wait for every other node. Then, on a
/// pipeline stage, the earliest 1F1B slot ([`super::pipeline::order`]). Ties break by creation order.
pub fn run(graph: &Graph, options: &ScheduleOptions) -> Result<Schedule, StageError> {
    let n = graph.len();
    let users: Vec<Vec<ValueId>> = graph.values().map(|v| graph.users(v)).collect();
    let mut pending = vec![0usize; n];
    let mut dependents: Vec<Vec<ValueId>> = vec![Vec::new(); n];
    for v in graph.values().filter(|&v| is_step(graph, v)) {
        let deps = dependencies(graph, &users, v);
        pending[v.index()] = deps.len();
        for d in deps {
            dependents[d.index()].push(v);
        }
    }
    let steps = graph.values().filter(|&v| is_step(graph, v)).count();
    let non_update = graph
        .values()
        .filter(|&v| is_step(graph, v) && graph.node(v).phase != Phase::Update)
        .count();
    let slots = options.pipeline.map(|o| o.slots(graph));
    let priority = |v: ValueId| -> (bool, Reverse<u32>, Reverse<ValueId>) {
        let update = graph.node(v).phase == Phase::Update;
        let slot = slots.as_ref().map_or(0, |s| s[v.index()]);
        (
            update && options.optimizer_in_backward,
            Reverse(slot),
            Reverse(v),
        )
    };
    let mut ready: BinaryHeap<(bool, Reverse<u32>, Reverse<ValueId>)> = BinaryHeap::new();
    let mut deferred: Vec<ValueId> = Vec::new();
    let mut order = Vec::with_capacity(steps);
    let mut done_non_update = 0;
    for v in graph
        .values()
        .filter(|&v| is_step(graph, v) && pending[v.index()] == 0)
    {
        ready.push(priority(v));
    }
    loop {
        let next = match ready.pop() {
            Some((_, _, Reverse(v))) => v,
            None if !deferred.is_empty() && done_non_update == non_update => {
                deferred.sort();
                for v in deferred.drain(..) {
                    ready.push(priority(v));
                }
                continue;
            }
            None => break,
        };
        if graph.node(next).phase == Phase::Update
            && !options.optimizer_in_backward
            && done_non_update < non_update
        {
            deferred.push(next);
            continue;
        }
        if graph.node(next).phase != Phase::Update {
            done_non_update += 1;
        }
        order.push(next);
        for &d in &dependents[next.index()] {
            pending[d.index()] -= 1;
            if pending[d.index()] == 0 {
                ready.push(priority(d));
            }
        }
    }
    if order.len() != steps {
        return Err(StageError::internal(
            "schedule",
            format!(
                "scheduled {} of {steps} steps (dependency cycle)",
                order.len()
            ),
        ));
    }
    Ok(Schedule { order })
}

/// Checks that `order` lists every step once, after all its dependencies.
pub fn verify(graph: &Graph, schedule: &Schedule) -> Result<(), StageError> {
    let users: Vec<Vec<ValueId>> = graph.values().map(|v| graph.users(v)).collect();
    let mut position = vec![usize::MAX; graph.len()];
    for (i, &v) in schedule.order.iter().enumerate() {
        if position[v.index()] != usize::MAX {
            return Err(StageError::internal(
                "schedule",
                format!("{v} is scheduled twice"),
            ));
        }
        position[v.index()] = i;
    }
    for v in graph.values().filter(|&v| is_step(graph, v)) {
        let p = position[v.index()];
        if p == usize::MAX {
            return Err(StageError::internal(
                "schedule",
                format!("{v} is never scheduled"),
            ));
        }
        if let Some(d) = dependencies(graph, &users, v)
            .into_iter()
            .find(|d| position[d.index()] >= p)
        {
            return Err(StageError::internal(
                "schedule",
                format!("{v} runs before its dependency {d}"),
            ));
        }
    }
    Ok(())
}
