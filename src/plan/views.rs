//! Views: a `reshape` (or a tensor-parallel region's entry, `tensor_copy`, the same value on
//! every tensor rank) changes no byte of a contiguous tensor, so its output shares its
//! input's storage instead of being copied; a `member` of a cast group is a range of the
//! group's bytes. The view's buffer sits at its root's offset (plus the member's place in
//! it), its step launches no kernel, and the root lives as long as any of its views.
//!
//! A value becomes a view only when sharing is safe and the accounting stays exact: its
//! root is a value a step computes (not a parameter, optimizer state or input, which are
//! bound from outside), nothing writes the root in place, and both hold the same kind of
//! bytes (the same buffer class, so the report's parts add up as before), or the view is a
//! temporary over a saved activation (a backward step reading the activation reshaped: the
//! bytes stay the activation's, and the temporary copy it replaces is gone), or a
//! parameter's gradient that is a member of a temporary (a merged op's output, such as a
//! norm's input and weight gradients: the report counts the member's bytes as gradients).

use super::BufferClass;
use crate::ir::{Graph, Op, ValueId};
use crate::passes::liveness::Interval;

/// The value whose storage each value shares (by value index): `Some(root)` for a view,
/// `None` for a value with storage of its own. `class` gives each value's buffer class
/// (views need the root's, or are temporaries over an activation). Roots are never views
/// themselves.
pub fn roots(graph: &Graph, class: impl Fn(ValueId) -> BufferClass) -> Vec<Option<ValueId>> {
    let mut written_in_place = vec![false; graph.len()];
    for v in graph.values() {
        let node = graph.node(v);
        for &i in node.op.mutated_inputs() {
            if let Some(&u) = node.inputs.get(i) {
                written_in_place[u.index()] = true;
            }
        }
    }
    let mut root: Vec<Option<ValueId>> = vec![None; graph.len()];
    for v in graph.values() {
        let node = graph.node(v);
        let same_bytes = matches!(
            node.op,
            Op::Reshape { .. } | Op::TensorCopy { .. } | Op::Member { .. }
        );
        if !same_bytes || written_in_place[v.index()] {
            continue;
        }
        let input = node.inputs[0];
        let r = root[input.index()].unwrap_or(input);
        let source = graph.node(r).op.class() == crate::ir::OpClass::Source;
        let kinds = (class(r), class(v));
        let member = matches!(node.op, Op::Member { .. });
        let shared = kinds.0 == kinds.1
            || kinds == (BufferClass::Activation, BufferClass::Temporary)
            || (member && kinds == (BufferClass::Temporary, BufferClass::Gradient));
        if !source && !written_in_place[r.index()] && shared {
            root[v.index()] = Some(r);
        }
    }
    root
}

/// The byte offset of each value's storage in its root's (by value index): the bytes of a
/// member's flat input's elements before it, plus its input's own offset; 0 for a value with
/// storage of its own.
pub fn offsets(graph: &Graph, roots: &[Option<ValueId>]) -> Vec<u64> {
    let mut offset = vec![0u64; graph.len()];
    for v in graph.values() {
        if roots[v.index()].is_none() {
            continue;
        }
        let node = graph.node(v);
        let own = match node.op {
            Op::Member { offset, .. } => offset as u64 * graph.node(node.inputs[0]).ty.dtype.size(),
            _ => 0,
        };
        offset[v.index()] = offset[node.inputs[0].index()] + own;
    }
    offset
}

/// Extends each root's lifetime over its views' (a view with no lifetime adds nothing).
pub fn extend_roots(lives: &mut [Option<Interval>], roots: &[Option<ValueId>]) {
    for (v, r) in roots.iter().enumerate() {
        let (Some(r), Some(view)) = (r, lives[v]) else {
            continue;
        };
        if let Some(root) = lives[r.index()].as_mut() {
            root.first = root.first.min(view.first);
            root.last = root.last.max(view.last);
        }
    }
}
