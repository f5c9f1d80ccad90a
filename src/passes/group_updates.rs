//! Multi-tensor updates: the fp32-moment AdamW steps of one block instance's parameters (or
//! of the top level's), when they share hyper-parameters, types and multiplier, become one
//! `adamw_group` op, one launch instead of one a parameter. Each parameter is stepped
//! exactly as its own AdamW would step it. Updating after backward, every gradient waits
//! for the whole backward anyway, so a scope's updates all group. With the optimizer in
//! backward a group runs once the last of its gradients is complete, so only parameters
//! whose gradient is small join (at most [`IN_BACKWARD_HOLD`] bytes and at most
//! 1/[`IN_BACKWARD_SHARE`] of all the gradients' bytes: biases, norm scales): a large
//! weight's gradient still dies at its own update. After checkpointing, the large weights'
//! steps join their scope's group too where that does not raise the step's peak of live
//! bytes (`crate::budget::plan_with`: the held gradients fall after the peak, as on GPT-2,
//! whose peak is the loss head). Updates on host copies (`--offload
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

/// A member of a group: an AdamW step, or a group made earlier (whose steps it takes).
struct Member {
    /// The (param, grad, m, v) quadruples it steps.
    quads: usize,
    hyper: AdamWParams,
}

/// What `v` brings to a group: its quadruples and hyper-parameters, for an AdamW step or
/// group with fp32 moments rounded to nearest.
fn member(graph: &Graph, v: ValueId) -> Option<Member> {
    match &graph.node(v).op {
        Op::AdamW(h) if h.state == StateFormat::Fp32 && h.rounding == Rounding::Nearest => {
            Some(Member {
                quads: 1,
                hyper: *h,
            })
        }
        Op::AdamWGroup { hyper, tensors } => Some(Member {
            quads: *tensors as usize,
            hyper: *hyper,
        }),
        _ => None,
    }
}

/// The group key of an AdamW step (or group) that may join one: fp32 moments rounded to
/// nearest, its parameters parameters (not host copies or a shard's gathers), its output
/// unread, and each gradient at most `hold` bytes (None: any).
fn key(graph: &Graph, v: ValueId, hold: Option<u64>) -> Option<(Key, Member)> {
    let node = graph.node(v);
    let m = member(graph, v)?;
    let quads = node.inputs.get(..4 * m.quads)?;
    let held = |q: &[ValueId]| hold.is_none_or(|h| graph.node(q[1]).ty.bytes() <= h);
    let param = |q: &[ValueId]| graph.node(q[0]).op.class() == OpClass::Source;
    let each = quads.chunks(4).all(|q| held(q) && param(q));
    if !each || !graph.users(v).is_empty() {
        return None;
    }
    let h = m.hyper;
    let bits = [h.lr, h.beta1, h.beta2, h.eps, h.weight_decay].map(f32::to_bits);
    let types = [0, 1, 2].map(|i| graph.node(node.inputs[i]).ty.dtype);
    let multiplier = node.inputs.get(4 * m.quads).copied();
    Some(((node.scope.clone(), bits, types, multiplier), m))
}

/// `graph` with its groupable AdamW steps grouped (see the module doc; `in_backward`: the
/// optimizer runs in backward), groups made earlier joining those of their key; a group
/// sits where its last member was, every other node is copied unchanged in creation order.
/// Also each old value's new one (`None` for a step that joined a later group).
pub fn run(graph: &Graph, in_backward: bool) -> Result<(Graph, Vec<Option<ValueId>>), StageError> {
    let grads: u64 = (graph.values())
        .filter_map(|v| match graph.node(v).op {
            Op::AdamW(_) => Some(graph.node(graph.node(v).inputs[1]).ty.bytes()),
            _ => None,
        })
        .sum();
    let hold = in_backward.then(|| IN_BACKWARD_HOLD.min(grads / IN_BACKWARD_SHARE));
    grouped(graph, hold, |_| true)
}

/// The scopes with an AdamW step that [`run`] with the optimizer in backward left single.
pub fn single_scopes(graph: &Graph) -> Vec<String> {
    let mut scopes: Vec<String> = Vec::new();
    for v in graph.values() {
        let scope = &graph.node(v).scope;
        let single = matches!(graph.node(v).op, Op::AdamW(_)) && key(graph, v, None).is_some();
        if single && !scopes.contains(scope) {
            scopes.push(scope.clone());
        }
    }
    scopes
}

/// `graph` with the steps of each of `scopes` one group (up to [`MAX_GROUP`] tensors a
/// group), large gradients' too, and groups made earlier joining it; as [`run`] otherwise.
pub fn run_scopes(
    graph: &Graph,
    scopes: &[String],
) -> Result<(Graph, Vec<Option<ValueId>>), StageError> {
    grouped(graph, None, |k| scopes.contains(&k.0))
}

/// The steps (AdamW steps and groups made earlier) [`run_scopes`] would group for `scope`,
/// each with the gradients it reads.
pub fn members_of(graph: &Graph, scope: &str) -> Vec<(ValueId, Vec<ValueId>)> {
    (graph.values())
        .filter_map(|v| {
            let (_, m) = key(graph, v, None).filter(|(k, _)| k.0 == scope)?;
            let inputs = &graph.node(v).inputs;
            Some((v, (0..m.quads).map(|q| inputs[4 * q + 1]).collect()))
        })
        .collect()
}

/// The grouping of [`run`], of the steps whose gradients take at most `hold` bytes (None:
/// any) and whose key `within` accepts.
fn grouped(
    graph: &Graph,
    hold: Option<u64>,
    within: impl Fn(&Key) -> bool,
) -> Result<(Graph, Vec<Option<ValueId>>), StageError> {
    let mut groups: Vec<(Key, Vec<(ValueId, usize)>)> = Vec::new();
    for v in graph.values() {
        let Some((k, m)) = key(graph, v, hold).filter(|(k, _)| within(k)) else {
            continue;
        };
        match groups.iter_mut().find(|(g, _)| *g == k) {
            Some((_, members)) => members.push((v, m.quads)),
            None => groups.push((k, vec![(v, m.quads)])),
        }
    }
    let mut edits: BTreeMap<ValueId, Edit> = BTreeMap::new();
    for (_, members) in &groups {
        for chunk in chunks(members) {
            if chunk.len() < 2 {
                continue;
            }
            let Some(Member { hyper, .. }) = member(graph, chunk[0].0) else {
                let message = "a non-AdamW step grouped as AdamW";
                return Err(StageError::internal("group_updates", message));
            };
            let mut inputs: Vec<ValueId> = Vec::new();
            for &(u, quads) in chunk {
                inputs.extend_from_slice(&graph.node(u).inputs[..4 * quads]);
                edits.insert(u, Edit::Drop);
            }
            let (first, quads) = chunk[0];
            inputs.extend(graph.node(first).inputs.get(4 * quads).copied());
            let op = group_op(hyper, chunk.iter().map(|&(_, q)| q).sum());
            if let Some(&(last, _)) = chunk.last() {
                edits.insert(last, Edit::Rebuild(op, inputs));
            }
        }
    }
    rebuild(graph, "group_updates", |v| {
        edits.remove(&v).unwrap_or(Edit::Keep)
    })
}

/// `members` (each with its quadruple count) cut into runs of at most [`MAX_GROUP`]
/// quadruples, in order.
fn chunks(members: &[(ValueId, usize)]) -> Vec<&[(ValueId, usize)]> {
    let mut out = Vec::new();
    let (mut start, mut quads) = (0, 0);
    for (i, &(_, q)) in members.iter().enumerate() {
        if quads + q > MAX_GROUP && i > start {
            out.push(&members[start..i]);
            (start, quads) = (i, 0);
        }
        quads += q;
    }
    if start < members.len() {
        out.push(&members[start..]);
    }
    out
}

/// The group op of `tensors` steps with `hyper`.
fn group_op(hyper: AdamWParams, tensors: usize) -> Op {
    Op::AdamWGroup {
        hyper,
        tensors: tensors as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::{chunks, MAX_GROUP};
    use crate::ir::ValueId;

    #[test]
    fn groups_are_cut_at_the_most_tensors_a_group_takes() {
        let half = MAX_GROUP / 2 + 1;
        let members = [(ValueId(1), half), (ValueId(2), half), (ValueId(3), 1)];
        let cut: Vec<Vec<u32>> = chunks(&members)
            .iter()
            .map(|c| c.iter().map(|(v, _)| v.0).collect())
            .collect();
        assert_eq!(cut, vec![vec![1], vec![2, 3]]);
        let whole = [(ValueId(1), MAX_GROUP - 1), (ValueId(2), 1)];
        assert_eq!(chunks(&whole).len(), 1);
    }
}
