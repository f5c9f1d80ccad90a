//! Attention over q, k and v sliced from one tensor (`split(x @ qkv, 3, axis = -1)`) reads
//! them from `x` instead: `attention(slice(x), slice(x), slice(x))`, where only the attention
//! and its backward ops read the slices, becomes `packed_attention(x)`, and the concat of its
//! three backward ops (`concat_grads`' gradient of `x`), where only the concat reads each,
//! becomes one `packed_attention_backward(x, dout)` writing `dq | dk | dv`. The three slice
//! copies, the concat and two of the three backward ops' row statistics are gone; the values
//! are the same (the same sums in the same order). Attention whose operands are not such
//! slices (rotated by rope, say), or whose gradients are read elsewhere, is left as it is.

use super::rewrite::{rebuild, Edit};
use super::StageError;
use crate::ir::{AttnInput, AttnParams, Graph, Op, ValueId};
use std::collections::{BTreeMap, BTreeSet};

/// One attention to pack: its params and packed forward's inputs (`x`, the key mask if any),
/// the slices it replaces, and, when its gradients are taken, the concat that becomes the
/// packed backward with that op's inputs.
struct Packing {
    attn: AttnParams,
    inputs: Vec<ValueId>,
    slices: [ValueId; 3],
    backward: Option<Backward>,
}

/// The gradient side of a [`Packing`]: the concat, the three backward ops it reads, and the
/// packed backward's inputs (`x`, `dout`, the key mask if any).
struct Backward {
    concat: ValueId,
    ops: [ValueId; 3],
    inputs: Vec<ValueId>,
}

/// The tensor that `slices` cut into q, k and v blocks of `a` along its last axis, in order
/// and covering it, when they do.
fn packed_operand(graph: &Graph, slices: &[ValueId], a: &AttnParams) -> Option<ValueId> {
    let x = *graph.node(slices[0]).inputs.first()?;
    let shape = &graph.node(x).ty.shape;
    let (rank, width) = (shape.len(), *shape.last()?);
    let blocks = a.heads + 2 * a.kv_heads;
    if rank != 3 || a.heads == 0 || !width.is_multiple_of(blocks) {
        return None;
    }
    let dh = width / blocks;
    let bounds = [0, a.heads, a.heads + a.kv_heads, blocks].map(|h| h * dh);
    let tiles = slices.iter().enumerate().all(|(i, &s)| {
        let node = graph.node(s);
        let want = Op::Slice {
            axis: rank - 1,
            start: bounds[i],
            end: bounds[i + 1],
        };
        node.op == want && node.inputs == [x]
    });
    tiles.then_some(x)
}

/// The backward side of attention `v` of `a` over `slices`, given the slices' other readers:
/// `None` when there are none; `Some(None)` when they do not match (see the module doc).
fn backward(
    graph: &Graph,
    a: &AttnParams,
    slices: [ValueId; 3],
    readers: &[ValueId],
    outputs: &BTreeSet<ValueId>,
) -> Option<Option<Backward>> {
    if readers.is_empty() {
        return Some(None);
    }
    let [dq, dk, dv] = readers else {
        return None;
    };
    let ops = [*dq, *dk, *dv];
    let first = graph.node(ops[0]);
    let whiches = [AttnInput::Q, AttnInput::K, AttnInput::V];
    let concat = *graph.users(ops[0]).first()?;
    let each = ops.iter().zip(whiches).all(|(&b, which)| {
        let node = graph.node(b);
        node.op == Op::AttentionBackward { attn: *a, which }
            && node.inputs == first.inputs
            && graph.users(b) == [concat]
            && !outputs.contains(&b)
    });
    let cat = graph.node(concat);
    let fits = each
        && first.inputs[..3] == slices[..]
        && cat.op == (Op::Concat { axis: 2 })
        && cat.inputs == ops;
    let mut inputs = vec![graph.node(slices[0]).inputs[0], first.inputs[3]];
    inputs.extend(first.inputs.get(4));
    fits.then_some(Some(Backward {
        concat,
        ops,
        inputs,
    }))
}

/// The packing of attention `v`, when it has one (see the module doc).
fn packing(graph: &Graph, v: ValueId, outputs: &BTreeSet<ValueId>) -> Option<Packing> {
    let node = graph.node(v);
    let Op::Attention(a) = node.op else {
        return None;
    };
    let slices: [ValueId; 3] = node.inputs.get(..3)?.try_into().ok()?;
    let x = packed_operand(graph, &slices, &a)?;
    if slices.iter().any(|s| outputs.contains(s)) {
        return None;
    }
    let readers: BTreeSet<ValueId> = slices.iter().flat_map(|&s| graph.users(s)).collect();
    let others: Vec<ValueId> = readers.into_iter().filter(|&r| r != v).collect();
    let backward = backward(graph, &a, slices, &others, outputs)?;
    let mut inputs = vec![x];
    inputs.extend(node.inputs.get(3));
    Some(Packing {
        attn: a,
        inputs,
        slices,
        backward,
    })
}

/// `graph` with every attention over slices of one tensor packed (see the module doc): the
/// new graph and each old value's new one (`None` for a slice, a separate backward op).
pub fn fold(graph: &Graph) -> Result<(Graph, Vec<Option<ValueId>>), StageError> {
    let outputs: BTreeSet<ValueId> = graph.outputs.iter().map(|(_, v)| *v).collect();
    let mut edits: BTreeMap<ValueId, Edit> = BTreeMap::new();
    for v in graph.values() {
        let Some(p) = packing(graph, v, &outputs) else {
            continue;
        };
        edits.insert(v, Edit::Rebuild(Op::PackedAttention(p.attn), p.inputs));
        let mut dropped = p.slices.to_vec();
        if let Some(b) = p.backward {
            let op = Op::PackedAttentionBackward(p.attn);
            edits.insert(b.concat, Edit::Rebuild(op, b.inputs));
            dropped.extend(b.ops);
        }
        edits.extend(dropped.into_iter().map(|d| (d, Edit::Drop)));
    }
    rebuild(graph, "packed_attention", |v| {
        edits.remove(&v).unwrap_or(Edit::Keep)
    })
}

#[cfg(test)]
mod tests;
