//! Backward's recomputed activation beside its gradient: where checkpointing recomputes
//! `f(x)` in backward (a GELU's output for the next weight gradient) and backward also takes
//! `f'(x) * dy` of the same `x`, one `unary_pair` launch reads `x` once and writes both into
//! one flat buffer, each read through an [`Op::Member`] view. The pair's values then live
//! together: the planner makes the pair only where that does not raise the step's peak
//! (`crate::launch_groups`).

use super::rewrite::rebuild_each;
use super::StageError;
use crate::ir::{Graph, Op, Phase, ValueId};
use std::collections::BTreeMap;

/// The pairs `(f(x), f'(x) * dy)` of backward nodes that one launch can compute: the
/// gradient's `dy` exists where the activation is computed (so the pair runs there), and
/// neither is a graph output.
pub fn pairs(graph: &Graph) -> Vec<(ValueId, ValueId)> {
    let outputs: Vec<ValueId> = graph.outputs.iter().map(|(_, v)| *v).collect();
    let free = |v: ValueId| !outputs.contains(&v);
    let mut out: Vec<(ValueId, ValueId)> = Vec::new();
    for dx in graph.values().filter(|&v| free(v)) {
        let node = graph.node(dx);
        let (Op::UnaryBackward(f), &[x, dy]) = (&node.op, &node.inputs[..]) else {
            continue;
        };
        let activation = graph.values().find(|&y| {
            let n = graph.node(y);
            n.op == Op::Unary(*f)
                && n.inputs == [x]
                && n.phase == Phase::Backward
                && dy < y
                && y < dx
                && free(y)
                && !out.iter().any(|&(taken, _)| taken == y)
        });
        if let Some(y) = activation {
            out.push((y, dx));
        }
    }
    out
}

/// `graph` with each of `pairs` one `unary_pair` at its activation, the two values member
/// views of its output; also each old value's new one.
pub fn run(
    graph: &Graph,
    pairs: &[(ValueId, ValueId)],
) -> Result<(Graph, Vec<Option<ValueId>>), StageError> {
    let activation_of: BTreeMap<ValueId, usize> = pairs
        .iter()
        .enumerate()
        .map(|(i, &(y, _))| (y, i))
        .collect();
    let gradient_of: BTreeMap<ValueId, usize> = pairs
        .iter()
        .enumerate()
        .map(|(i, &(_, dx))| (dx, i))
        .collect();
    let mut roots: Vec<Option<ValueId>> = vec![None; pairs.len()];
    rebuild_each(graph, "unary_pairs", |b, v| {
        let node = graph.node(v);
        let shape = node.ty.shape.clone();
        if let Some(&i) = activation_of.get(&v) {
            let Op::Unary(f) = node.op else {
                return b.copy(v);
            };
            let (x, dy) = (node.inputs[0], graph.node(pairs[i].1).inputs[1]);
            let root = b.add(v, Op::UnaryPair(f), vec![b.new_of(x)?, b.new_of(dy)?])?;
            roots[i] = Some(root);
            return b.add(v, Op::member(0, shape), vec![root]);
        }
        let Some(root) = gradient_of.get(&v).and_then(|&i| roots[i]) else {
            return b.copy(v);
        };
        let n = node.ty.numel();
        let (at, _) = crate::ops::packed_pair(n, n, node.ty.dtype.size());
        b.add(v, Op::member(at as usize, shape), vec![root])
    })
}
