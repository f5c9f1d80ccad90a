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
//! Under ZeRO-1 and 2 with mixed precision ([`keep_16bit_copies`], before autodiff) a
//! parameter that only its 16-bit weight copy reads is stored as that copy, whole, and its
//! fp32 master weights are this rank's shard of optimizer state, as DeepSpeed keeps them:
//! the update writes the master shard and every rank's shard is gathered into the 16-bit
//! copy, rounded to nearest as the cast did, so the ranks compute what one rank does.

use super::StageError;
use crate::ir::{DType, Graph, Op, Origin, Phase, TensorType, TypeError, ValueId};
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
                ..
            } if ty.dtype.is_float() => {
                let len = shard_len(ty.numel(), ranks) as usize;
                let op = Op::Param {
                    name: name.clone(),
                    ty: TensorType::new(ty.dtype, vec![len]),
                    init: *init,
                    frozen: false,
                    buffer: false,
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
    Ok(Sharded::finished(graph, out, map))
}

/// The graph with every trained fp32 parameter that one cast to a 16-bit dtype alone reads
/// replaced by a parameter of that dtype, whole, read where the cast was (same name and
/// initializer, so it starts from the values the cast gave); every other node is copied
/// unchanged in creation order. The optimizer pass gives each such parameter an fp32
/// master shard ([`update_target`]). Parameters that fp32 ops read stay fp32.
pub fn keep_16bit_copies(graph: &Graph) -> Result<Sharded, StageError> {
    let mut out = Graph::new();
    let mut map: Vec<ValueId> = Vec::with_capacity(graph.len());
    for v in graph.values() {
        let node = graph.node(v);
        let origin = node.origin();
        let new = match (&node.op, only_16bit_copy(graph, v)) {
            (Op::Param { .. }, Some(dtype)) => {
                let mut op = node.op.clone();
                if let Op::Param { ty, .. } = &mut op {
                    *ty = ty.with_dtype(dtype);
                }
                out.add(op, vec![], &origin).map_err(internal)?
            }
            (Op::Cast { to }, _) => {
                let input = map[node.inputs[0].index()];
                match out.node(input).ty.dtype == *to {
                    true => input,
                    false => out
                        .add(node.op.clone(), vec![input], &origin)
                        .map_err(internal)?,
                }
            }
            (op, _) => {
                let inputs = node.inputs.iter().map(|u| map[u.index()]).collect();
                out.add(op.clone(), inputs, &origin).map_err(internal)?
            }
        };
        map.push(new);
    }
    Ok(Sharded::finished(graph, out, map))
}

/// For a trained fp32 parameter `p` that one cast to a 16-bit dtype alone reads (and that
/// is no output), that dtype.
fn only_16bit_copy(graph: &Graph, p: ValueId) -> Option<DType> {
    let is_output = |v: ValueId| graph.outputs.iter().any(|(_, o)| *o == v);
    let trained =
        matches!(&graph.node(p).op, Op::Param { ty, frozen: false, .. } if ty.dtype == DType::F32);
    match graph.users(p).as_slice() {
        _ if !trained => None,
        [c] if !is_output(p) => match graph.node(*c).op {
            Op::Cast {
                to: to @ (DType::BF16 | DType::F16),
            } => Some(to),
            _ => None,
        },
        _ => None,
    }
}

/// The fp32 master shard that the update of 16-bit parameter `p` writes and gathers into
/// it ([`keep_16bit_copies`]), if it has one.
pub fn master_of(graph: &Graph, p: ValueId) -> Option<ValueId> {
    graph.users(p).into_iter().find_map(|u| {
        let node = graph.node(u);
        let master = *node.inputs.get(1)?;
        let widened = graph.node(master).ty.dtype != graph.node(p).ty.dtype;
        (matches!(node.op, Op::AllGatherInto { .. }) && node.inputs[0] == p && widened)
            .then_some(master)
    })
}

/// The parameter whose update writes `target`: the parameter a shard was taken of, the
/// 16-bit parameter a master shard is gathered into, else `target` itself.
pub fn updated_param(graph: &Graph, target: ValueId) -> ValueId {
    match graph.node(target).op {
        Op::Shard { .. } => graph.node(target).inputs[0],
        Op::OptimState { .. } => graph
            .users(target)
            .into_iter()
            .find(|&u| {
                matches!(graph.node(u).op, Op::AllGatherInto { .. })
                    && graph.node(u).inputs.get(1) == Some(&target)
            })
            .map_or(target, |u| graph.node(u).inputs[0]),
        _ => target,
    }
}

/// The ranks' mean gradient that an update's gradient `g` was taken from: the all-reduced
/// gradient a ZeRO-1 shard was cut from (whole: every rank holds it), the collective's
/// output that the update's cast widened for a master shard; `g` itself otherwise.
pub fn reduced_gradient(graph: &Graph, g: ValueId) -> ValueId {
    let input = |v: ValueId| graph.node(v).inputs.first().copied();
    let mut v = g;
    let widened = graph.node(v).phase == Phase::Update;
    if let (Op::Cast { .. }, Some(i), true) = (&graph.node(v).op, input(v), widened) {
        if matches!(
            graph.node(i).op,
            Op::Shard { .. } | Op::ReduceScatter { .. } | Op::AllReduce { .. }
        ) {
            v = i;
        }
    }
    match (&graph.node(v).op, input(v)) {
        (Op::Shard { .. }, Some(i)) => i,
        _ => v,
    }
}

impl Sharded {
    /// `out` with `graph`'s outputs, each at its new value.
    fn finished(graph: &Graph, mut out: Graph, map: Vec<ValueId>) -> Sharded {
        out.outputs = (graph.outputs.iter())
            .map(|(name, v)| (name.clone(), map[v.index()]))
            .collect();
        Sharded { graph: out, map }
    }
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
/// shard of the mean (a gather's gradient), and is returned as it is, as it is on a
/// pipeline stage with one data rank (no other rank to average with).
pub fn reduce_gradients(
    graph: &mut Graph,
    grad: ValueId,
    parallel: Parallel,
    origin: &Origin,
) -> Result<ValueId, StageError> {
    let ranks = parallel.ranks();
    let op = match parallel.zero {
        // A pipeline stage without data replicas has no other rank to average with.
        0 | 1 if ranks == 1 && parallel.pipeline > 1 => return Ok(grad),
        0 | 1 => Op::AllReduce { ranks },
        2 => Op::ReduceScatter { ranks },
        _ => return Ok(grad),
    };
    graph.add(op, vec![grad], origin).map_err(internal)
}

/// What a ZeRO-1 or ZeRO-2 update writes in place, and the gradient it reads: this rank's
/// shard of the parameter and of the (all-reduced) gradient; for a 16-bit parameter with
/// fp32 masters (`masters`, see [`keep_16bit_copies`]) the master shard, optimizer state
/// named `<param>.master`, and the gradient's shard widened to fp32. None for the other
/// stages, which update the parameter itself. The caller gathers the updated shard into the
/// parameter with [`gather_update`].
pub fn update_target(
    graph: &mut Graph,
    (param, grad): (ValueId, ValueId),
    (parallel, masters): (Parallel, bool),
    origin: &Origin,
) -> Result<Option<(ValueId, ValueId)>, StageError> {
    if !matches!(parallel.zero, 1 | 2) {
        return Ok(None);
    }
    let ranks = parallel.ranks();
    let node = graph.node(param);
    let target = match &node.op {
        Op::Param { name, ty, .. } if masters && ty.dtype != DType::F32 => {
            let state = Op::OptimState {
                name: format!("{name}.master"),
                ty: TensorType::new(DType::F32, vec![shard_len(ty.numel(), ranks) as usize]),
                init: 0.0,
            };
            graph.add(state, vec![], origin).map_err(internal)?
        }
        _ => graph
            .add(Op::Shard { ranks }, vec![param], origin)
            .map_err(internal)?,
    };
    let target_ty = graph.node(target).ty.clone();
    let mut grad = grad;
    if graph.node(grad).ty.shape != target_ty.shape {
        grad = graph
            .add(Op::Shard { ranks }, vec![grad], origin)
            .map_err(internal)?;
    }
    if graph.node(grad).ty.dtype != target_ty.dtype {
        let to = target_ty.dtype;
        grad = graph
            .add(Op::Cast { to }, vec![grad], origin)
            .map_err(internal)?;
    }
    Ok(Some((target, grad)))
}

/// Writes every rank's updated shard `target` into `param` (after the update), rounding an
/// fp32 master shard to a 16-bit parameter's dtype.
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
