//! The gradient of a value split into slices that tile one axis (`split` into q, k and v):
//! autodiff writes it as the sum of each slice's gradient zero-padded to the whole value
//! (a `pad_slice` per slice, an `add` per further slice). This pass makes that sum one
//! `concat` of the slices' gradients in axis order: the same values (adding a padded zero
//! leaves a gradient as it is, but for the sign of a zero gradient) in one step instead of
//! 2n - 1, without the n padded copies.

use super::autodiff::Differentiated;
use super::rewrite::{rebuild, remap_pairs, Edit};
use super::StageError;
use crate::ir::{BinaryFn, Graph, Op, Phase, ValueId};
use std::collections::{BTreeMap, BTreeSet};

/// Whether `v` is a backward `add` that only `reader` reads (no graph output).
fn inner_add(graph: &Graph, v: ValueId, reader: ValueId, outputs: &BTreeSet<ValueId>) -> bool {
    let node = graph.node(v);
    node.op == Op::Binary(BinaryFn::Add)
        && node.phase == Phase::Backward
        && graph.users(v) == [reader]
        && !outputs.contains(&v)
}

/// For a backward `add` whose operands (through adds only it reads) are padded slice
/// gradients tiling one axis: the adds and pads it replaces, and the concat's axis and
/// inputs in axis order.
fn tiling(
    graph: &Graph,
    root: ValueId,
    outputs: &BTreeSet<ValueId>,
) -> Option<(Vec<ValueId>, usize, Vec<ValueId>)> {
    let node = graph.node(root);
    if node.op != Op::Binary(BinaryFn::Add) || node.phase != Phase::Backward {
        return None;
    }
    let mut folded = Vec::new();
    let mut stack = vec![(root, root)];
    let mut pads = Vec::new();
    while let Some((v, reader)) = stack.pop() {
        if v == root || inner_add(graph, v, reader, outputs) {
            if v != root {
                folded.push(v);
            }
            stack.extend(graph.node(v).inputs.iter().map(|&i| (i, v)));
        } else {
            pads.push((v, reader));
        }
    }
    let mut slices = BTreeMap::new();
    let mut along = None;
    for (p, reader) in pads {
        let pad = graph.node(p);
        let Op::PadSlice { axis, start, full } = pad.op else {
            return None;
        };
        let single = graph.users(p) == [reader] && !outputs.contains(&p);
        let slice = &graph.node(pad.inputs[0]).ty;
        let extent = slice.shape.get(axis).copied()?;
        let same = slice.dtype == node.ty.dtype && pad.ty == node.ty;
        if !single || !same || *along.get_or_insert((axis, full)) != (axis, full) {
            return None;
        }
        if slices.insert(start, (p, pad.inputs[0], extent)).is_some() {
            return None;
        }
        folded.push(p);
    }
    let (axis, full) = along?;
    let mut next = 0;
    let mut inputs = Vec::with_capacity(slices.len());
    for (start, (_, g, extent)) in slices {
        if start != next {
            return None;
        }
        next += extent;
        inputs.push(g);
    }
    (next == full && inputs.len() > 1).then_some((folded, axis, inputs))
}

/// `diff` with every such sum of padded slice gradients made one concat (see the module
/// doc); gradients, outputs and every other node keep their meaning (ids are renumbered).
pub fn run(diff: &Differentiated) -> Result<Differentiated, StageError> {
    let graph = &diff.graph;
    let outputs: BTreeSet<ValueId> = graph.outputs.iter().map(|(_, v)| *v).collect();
    let mut dropped = BTreeSet::new();
    let mut concats = BTreeMap::new();
    for v in graph.values().collect::<Vec<_>>().into_iter().rev() {
        if dropped.contains(&v) {
            continue;
        }
        if let Some((folded, axis, inputs)) = tiling(graph, v, &outputs) {
            dropped.extend(folded);
            concats.insert(v, (axis, inputs));
        }
    }
    let (out, map) = rebuild(graph, "concat_grads", |v| match concats.get(&v) {
        Some((axis, inputs)) => Edit::Rebuild(Op::Concat { axis: *axis }, inputs.clone()),
        None if dropped.contains(&v) => Edit::Drop,
        None => Edit::Keep,
    })?;
    Ok(Differentiated {
        graph: out,
        grads: remap_pairs(&diff.grads, &map, "concat_grads")?,
        alternatives: Vec::new(),
    })
}
