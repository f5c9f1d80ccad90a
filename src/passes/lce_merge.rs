//! The fused loss head's two backward ops as one: `linear_cross_entropy_backward_input` and
//! `_weight` on the same operands each recompute the logits chunk by chunk; merged
//! ([`LceGrad::Both`]) they compute them once, for one pass fewer over the head's largest
//! GEMMs. The merged op writes both gradients into one flat buffer, each read through an
//! [`Op::Member`] view, so the pair's values live together: the planner merges only where
//! that does not raise the step's peak (`crate::launch_groups`).

use super::rewrite::rebuild_each;
use super::StageError;
use crate::ir::{Graph, LceGrad, Op, ValueId};
use std::collections::{BTreeMap, BTreeSet};

/// The pairs of backward ops on the same operands, as (input gradient, weight gradient),
/// neither of them in `skip`.
pub fn pairs(graph: &Graph, skip: &BTreeSet<ValueId>) -> Vec<(ValueId, ValueId)> {
    let of = |which: LceGrad| {
        graph.values().filter(move |&v| {
            let node = graph.node(v);
            matches!(node.op, Op::LinearCrossEntropyBackward { which: w, .. } if w == which)
                && !skip.contains(&v)
        })
    };
    of(LceGrad::Input)
        .filter_map(|dx| {
            let node = graph.node(dx);
            let Op::LinearCrossEntropyBackward { lce, .. } = node.op else {
                return None;
            };
            let twin = Op::LinearCrossEntropyBackward {
                lce,
                which: LceGrad::Weight,
            };
            let dw = of(LceGrad::Weight)
                .find(|&w| graph.node(w).op == twin && graph.node(w).inputs == node.inputs)?;
            Some((dx, dw))
        })
        .collect()
}

/// `graph` with each of `pairs` one merged backward op, placed at the first of the two, its
/// gradients member views of its output; also each old value's new one (a merged op's
/// gradients are their views).
pub fn run(
    graph: &Graph,
    pairs: &[(ValueId, ValueId)],
) -> Result<(Graph, Vec<Option<ValueId>>), StageError> {
    // Each grouped op, its pair's index and whether it is the input gradient.
    let mut pair_of: BTreeMap<ValueId, (usize, bool)> = BTreeMap::new();
    for (i, &(dx, dw)) in pairs.iter().enumerate() {
        pair_of.insert(dx, (i, true));
        pair_of.insert(dw, (i, false));
    }
    let mut roots: Vec<Option<ValueId>> = vec![None; pairs.len()];
    rebuild_each(graph, "lce_merge", |b, v| {
        let node = graph.node(v);
        let (Some(&(pair, is_dx)), Op::LinearCrossEntropyBackward { lce, .. }) =
            (pair_of.get(&v), &node.op)
        else {
            return b.copy(v);
        };
        let root = match roots[pair] {
            Some(root) => root,
            None => {
                let op = Op::LinearCrossEntropyBackward {
                    lce: *lce,
                    which: LceGrad::Both,
                };
                let inputs = (node.inputs.iter())
                    .map(|&i| b.new_of(i))
                    .collect::<Result<Vec<_>, _>>()?;
                let root = b.add(v, op, inputs)?;
                roots[pair] = Some(root);
                root
            }
        };
        let offset = match is_dx {
            true => 0,
            false => {
                let (x, w) = (
                    &graph.node(node.inputs[0]).ty,
                    &graph.node(node.inputs[1]).ty,
                );
                crate::ops::packed_pair(x.numel(), w.numel(), x.dtype.size()).0 as usize
            }
        };
        let shape = node.ty.shape.clone();
        b.add(v, Op::member(offset, shape), vec![root])
    })
}
