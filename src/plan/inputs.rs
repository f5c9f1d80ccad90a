//! What an input's binding says of its values, from the ops that read it (directly, or
//! the rows of it a pipeline stage's micro-batch slices): the bound on its ids, the id its
//! readers ignore, whether it is only an attention's key mask.

use crate::ir::{Graph, Op, ValueId};

/// The ops that read input `v`, each with the value it reads: `v` itself, or the rows of
/// `v` a slice takes (a pipeline stage's micro-batch).
fn readers(graph: &Graph, v: ValueId) -> Vec<(ValueId, ValueId)> {
    graph
        .users(v)
        .into_iter()
        .flat_map(|u| match graph.node(u).op {
            Op::Slice { .. } => graph.users(u).into_iter().map(|r| (r, u)).collect(),
            _ => vec![(u, v)],
        })
        .collect()
}

/// The exclusive bound on valid ids of an integer input, from the ops that read it.
pub(super) fn id_limit(graph: &Graph, v: ValueId) -> Option<u64> {
    readers(graph, v)
        .into_iter()
        .filter_map(|(u, v)| {
            let node = graph.node(u);
            match node.op {
                Op::Embedding { .. } if node.inputs[1] == v => {
                    Some(graph.node(node.inputs[0]).ty.shape[0] as u64)
                }
                Op::CrossEntropy(_) if node.inputs[1] == v => graph
                    .node(node.inputs[0])
                    .ty
                    .shape
                    .last()
                    .map(|&c| c as u64),
                Op::LinearCrossEntropy(lce) if node.inputs[2] == v => {
                    let w = &graph.node(node.inputs[1]).ty.shape;
                    Some(w[usize::from(!lce.transposed)] as u64)
                }
                // A key mask holds 0 (padding) or 1.
                Op::Attention(a) if a.key_mask && node.inputs.get(3) == Some(&v) => Some(2),
                Op::PackedAttention(a) if a.key_mask && node.inputs.get(1) == Some(&v) => Some(2),
                _ => None,
            }
        })
        .min()
}

/// Whether every reader of input `v` reads it as an attention's key mask (the only integer
/// operand of attention and of its backward).
pub(super) fn only_key_mask(graph: &Graph, v: ValueId) -> bool {
    let users = readers(graph, v);
    !users.is_empty()
        && users.into_iter().all(|(u, _)| match graph.node(u).op {
            Op::Attention(a)
            | Op::AttentionBackward { attn: a, .. }
            | Op::PackedAttention(a)
            | Op::PackedAttentionBackward(a) => a.key_mask,
            _ => false,
        })
}

/// The id every reader that bounds integer input `v` ignores (a cross-entropy's
/// `ignore_index`), when they all ignore the same one.
pub(super) fn id_ignored(graph: &Graph, v: ValueId) -> Option<i32> {
    let mut ignored = readers(graph, v).into_iter().filter_map(|(u, v)| {
        let node = graph.node(u);
        match node.op {
            Op::Embedding { .. } if node.inputs[1] == v => Some(None),
            Op::CrossEntropy(ce) if node.inputs[1] == v => Some(ce.ignore_index),
            Op::LinearCrossEntropy(lce) if node.inputs[2] == v => Some(lce.ce.ignore_index),
            _ => None,
        }
    });
    let first = ignored.next()??;
    ignored.all(|i| i == Some(first)).then_some(first)
}
