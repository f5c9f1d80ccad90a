//! Data parallelism with ZeRO as graph rewrites of one rank's step (its batch already
//! `1/N` of the whole). Under ZeRO-3 ([`shard_params`], after mixed precision and before
//! autodiff) every trained parameter is stored as this rank's flat shard and gathered where
//! it is read: a weight's low-precision copy is cast from the shard and then gathered (half
//! the bytes on the wire), any other reader reads a gather of the shard itself. Gathers are
//! weight copies (`checkpoint::is_weight_copy`), so each lives from its first forward reader
//! to its last and backward gathers again; autodiff turns each gather's gradient into a
//! reduce-scatter, so each rank receives its shard of the ranks' mean gradient.
//! [`reduce_gradients`] (in the optimizer pass) makes the other stages' gradients the ranks'
//! mean: ZeRO-0 and 1 all-reduce them, ZeRO-2 reduce-scatters them; [`update_target`] is the
//! shard a ZeRO-1 or ZeRO-2 update writes, whose result is gathered into the parameter.

use super::StageError;
use crate::ir::{Graph, Op, Origin, TensorType, TypeError, ValueId};
use crate::ops::collective::shard_len;
use crate::parallel::Parallel;
use std::collections::HashMap;

fn internal(e: TypeError) -> StageError {
    StageError::internal("partition", e.message)
}

/// A graph whose trained parameters are sharded, and where each old value went.
#[derive(Debug, Clone)]
pub struct Sharded {
    /// The rewritten graph.
    pub graph: Graph,
    /// The new value of each old one (a sharded parameter maps to its shard).
    pub map: Vec<ValueId>,
}

/// The graph with every trained floating-point parameter stored as a flat shard over
/// `ranks` ranks and gathered at its readers (see the module doc); every other node is
/// copied unchanged in creation order, and frozen parameters stay whole.
pub fn shard_params(graph: &Graph, ranks: u32) -> Result<Sharded, StageError> {
    let mut out = Graph::new();
    let mut map: Vec<ValueId> = Vec::with_capacity(graph.len());
    let mut shards: HashMap<ValueId, (ValueId, Vec<usize>)> = HashMap::new();
    let mut gathered: HashMap<ValueId, ValueId> = HashMap::new();
    for v in graph.values() {
        let node = graph.node(v);
        let origin = node.origin();
        let new = match &node.op {
            Op::Param {
                name,
                ty,
                init,
                frozen: false,
            } if ty.dtype.is_float() => {
                let len = shard_len(ty.numel(), ranks) as usize;
                let op = Op::Param {
                    name: name.clone(),
                    ty: TensorType::new(ty.dtype, vec![len]),
                    init: *init,
                    frozen: false,
                };
                let s = out.add(op, vec![], &origin).map_err(internal)?;
                shards.insert(v, (s, ty.shape.clone()));
                s
            }
            op @ Op::Cast { .. } if shards.contains_key(&node.inputs[0]) => {
                let (s, shape) = &shards[&node.inputs[0]];
                let copy = out.add(op.clone(), vec![*s], &origin).map_err(internal)?;
                gather(&mut out, copy, shape.clone(), ranks, &origin)?
            }
            op => {
                let mut inputs = Vec::with_capacity(node.inputs.len());
                for u in &node.inputs {
                    inputs.push(match (shards.get(u), gathered.get(u)) {
                        (_, Some(&g)) => g,
                        (Some((s, shape)), None) => {
                            let g = gather(&mut out, *s, shape.clone(), ranks, &origin)?;
                            gathered.insert(*u, g);
                            g
                        }
                        (None, None) => map[u.index()],
                    });
                }
                out.add(op.clone(), inputs, &origin).map_err(internal)?
            }
        };
        map.push(new);
    }
    out.outputs = graph
        .outputs
        .iter()
        .map(|(name, v)| (name.clone(), map[v.index()]))
        .collect();
    Ok(Sharded { graph: out, map })
}

fn gather(
    graph: &mut Graph,
    shard: ValueId,
    shape: Vec<usize>,
    ranks: u32,
    origin: &Origin,
) -> Result<ValueId, StageError> {
    let op = Op::AllGather { ranks, shape };
    graph.add(op, vec![shard], origin).map_err(internal)
}

/// The full shape of parameter `p` when `graph` stores it as a shard (a gather of it, or of
/// its cast, reads it), else None.
pub fn full_shape(graph: &Graph, p: ValueId) -> Option<Vec<usize>> {
    let gather_shape = |v: ValueId| match &graph.node(v).op {
        Op::AllGather { shape, .. } => Some(shape.clone()),
        _ => None,
    };
    graph.users(p).into_iter().find_map(|u| {
        gather_shape(u).or_else(|| match graph.node(u).op {
            Op::Cast { .. } => graph.users(u).into_iter().find_map(gather_shape),
            _ => None,
        })
    })
}

/// The gradient the update of a parameter reads, made the ranks' mean: all-reduced under
/// ZeRO-0 and 1, reduce-scattered under ZeRO-2; under ZeRO-3 it already is this rank's
/// shard of the mean (a gather's gradient), and is returned as it is.
pub fn reduce_gradients(
    graph: &mut Graph,
    grad: ValueId,
    parallel: Parallel,
    origin: &Origin,
) -> Result<ValueId, StageError> {
    let ranks = parallel.ranks();
    let op = match parallel.zero {
        0 | 1 => Op::AllReduce { ranks },
        2 => Op::ReduceScatter { ranks },
        _ => return Ok(grad),
    };
    graph.add(op, vec![grad], origin).map_err(internal)
}

/// What a ZeRO-1 or ZeRO-2 update writes in place, and the gradient it reads: this rank's
/// shard of the parameter and of the (all-reduced) gradient; None for the other stages,
/// which update the parameter itself. The caller gathers the updated shard into the
/// parameter with [`gather_update`].
pub fn update_target(
    graph: &mut Graph,
    (param, grad): (ValueId, ValueId),
    parallel: Parallel,
    origin: &Origin,
) -> Result<Option<(ValueId, ValueId)>, StageError> {
    if !matches!(parallel.zero, 1 | 2) {
        return Ok(None);
    }
    let ranks = parallel.ranks();
    let target = graph
        .add(Op::Shard { ranks }, vec![param], origin)
        .map_err(internal)?;
    let grad = if graph.node(grad).ty.shape == graph.node(target).ty.shape {
        grad
    } else {
        graph
            .add(Op::Shard { ranks }, vec![grad], origin)
            .map_err(internal)?
    };
    Ok(Some((target, grad)))
}

/// Writes every rank's updated shard `target` into `param` (after the update).
pub fn gather_update(
    graph: &mut Graph,
    (param, target): (ValueId, ValueId),
    parallel: Parallel,
    origin: &Origin,
) -> Result<(), StageError> {
    let op = Op::AllGatherInto {
        ranks: parallel.ranks(),
    };
    graph
        .add(op, vec![param, target], origin)
        .map_err(internal)
        .map(|_| ())
}
