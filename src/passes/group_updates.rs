//! Multi-tensor updates: the fp32-moment AdamW steps of one block instance's parameters (or
//! of the top level's), when they share hyper-parameters, types and multiplier, become one
//! `adamw_group` op, one launch instead of one a parameter. Each parameter is stepped
//! exactly as its own AdamW would step it. Updating after backward, every gradient waits
//! for the whole backward anyway, so a scope's updates all group. With the optimizer in
//! backward a group runs once the last of its gradients is complete, so only parameters
//! whose gradient is small join (at most [`IN_BACKWARD_HOLD`] bytes and at most
//! 1/[`IN_BACKWARD_SHARE`] of all the gradients' bytes: biases, norm scales): a large
//! weight's gradient still dies at its own update. Updates on host copies (`--offload
//! optimizer`) and on ZeRO shards are left alone: the pass only groups updates whose inputs
//! are the parameters themselves.

use super::rewrite::{rebuild, Edit};
use super::StageError;
use crate::ir::{DType, Graph, Op, OpClass, ValueId};
use crate::ops::optimizer::{AdamWParams, Rounding, StateFormat, MAX_GROUP};
use std::collections::BTreeMap;

/// The largest gradient whose update joins a group when the optimizer runs in backward.
pub const IN_BACKWARD_HOLD: u64 = 1 << 20;

/// With the optimizer in backward, a gradient joins a group only if it takes at most this
/// share (1/N) of all the gradients' bytes.
pub const IN_BACKWARD_SHARE: u64 = 1000;

/// What updates must share to be grouped: scope, hyper-parameters (as bits), the types of
/// parameter, gradient and moments, and the multiplier input.
type Key = (String, [u32; 5], [DType; 3], Option<ValueId>);

/// The group key of an AdamW step that may join one: fp32 moments rounded to nearest, its
/// parameter a parameter (not a host copy or a shard's gather), its output unread, and its
/// gradient at most `hold` bytes (None: any).
fn key(graph: &Graph, v: ValueId, hold: Option<u64>) -> Option<Key> {
    let node = graph.node(v);
    let Op::AdamW(h) = &node.op else {
        return None;
    };
    let plain = h.state == StateFormat::Fp32 && h.rounding == Rounding::Nearest;
    let param = graph.node(*node.inputs.first()?);
    let grad = graph.node(*node.inputs.get(1)?).ty.bytes();
    let held = hold.is_none_or(|h| grad <= h);
    if !plain || !held || param.op.class() != OpClass::Source || !graph.users(v).is_empty() {
        return None;
    }
    let bits = [h.lr, h.beta1, h.beta2, h.eps, h.weight_decay].map(f32::to_bits);
    let types = [0, 1, 2].map(|i| graph.node(node.inputs[i]).ty.dtype);
    Some((node.scope.clone(), bits, types, node.inputs.get(4).copied()))
}

/// `graph` with its groupable AdamW steps grouped (see the module doc; `in_backward`: the
/// optimizer runs in backward); a group sits where its last member was, every other node is
/// copied unchanged in creation order.
pub fn run(graph: &Graph, in_backward: bool) -> Result<Graph, StageError> {
    let grads: u64 = (graph.values())
        .filter_map(|v| match graph.node(v).op {
            Op::AdamW(_) => Some(graph.node(graph.node(v).inputs[1]).ty.bytes()),
            _ => None,
        })
        .sum();
    let hold = in_backward.then(|| IN_BACKWARD_HOLD.min(grads / IN_BACKWARD_SHARE));
    let mut groups: Vec<(Key, Vec<ValueId>)> = Vec::new();
    for v in graph.values() {
        let Some(k) = key(graph, v, hold) else {
            continue;
        };
        match groups.iter_mut().find(|(g, _)| *g == k) {
            Some((_, members)) => members.push(v),
            None => groups.push((k, vec![v])),
        }
    }
    let mut edits: BTreeMap<ValueId, Edit> = BTreeMap::new();
    for (_, members) in &groups {
        for chunk in members.chunks(MAX_GROUP).filter(|c| c.len() > 1) {
            let hyper = match &graph.node(chunk[0]).op {
                Op::AdamW(h) => *h,
                op => {
                    let message = format!("{} grouped as AdamW", op.name());
                    return Err(StageError::internal("group_updates", message));
                }
            };
            let mut inputs: Vec<ValueId> = Vec::with_capacity(4 * chunk.len() + 1);
            for &u in chunk {
                inputs.extend_from_slice(&graph.node(u).inputs[..4]);
                edits.insert(u, Edit::Drop);
            }
            inputs.extend(graph.node(chunk[0]).inputs.get(4).copied());
            let op = group_op(hyper, chunk.len());
            if let Some(&last) = chunk.last() {
                edits.insert(last, Edit::Rebuild(op, inputs));
            }
        }
    }
    let (out, _) = rebuild(graph, "group_updates", |v| {
        edits.remove(&v).unwrap_or(Edit::Keep)
    })?;
    Ok(out)
}

/// The group op of `tensors` steps with `hyper`.
fn group_op(hyper: AdamWParams, tensors: usize) -> Op {
    Op::AdamWGroup {
        hyper,
        tensors: tensors as u32,
    }
}
