//! Fuses the loss head of a forward graph: `cross_entropy(x @ w, t)` whose logits nothing
//! else reads becomes `mean(linear_cross_entropy(x, w, t))`, so no later stage sees the
//! `rows x V` logits or their gradient. The weight is `[D, V]`, or an `[V, D]` table `e`
//! written `transpose(e)` (or multiplied with `tb`), which the fused op reads in place: the
//! transpose is dropped when nothing else reads it. The pass runs before mixed precision,
//! which then casts the fused op's hidden states and weight as it would the matmul's.
//!
//! A cross-entropy with an ignored id keeps it (the fused op's per-row losses and gradients
//! are 0 on ignored rows) and its mean divides the rows' sum by the same `kept_count` value
//! the unfused op read, so the count is still made once per step.
//!
//! Each fused op gets the planner's default chunk ([`crate::ops::loss::default_chunk`]);
//! [`halve_chunks`] gives the smaller chunks the budget search tries.

use super::StageError;
use crate::ir::*;
use crate::ops::loss::default_chunk;

fn internal(e: TypeError) -> StageError {
    StageError::internal("fuse_loss", e.message)
}

/// A cross-entropy of a matmul to fuse: the matmul, the transpose it reads (if any), the
/// fused op's hidden states and weight, which rows it takes, and its count of kept rows (with
/// an ignored id).
struct Head {
    matmul: ValueId,
    transpose: Option<ValueId>,
    x: ValueId,
    w: ValueId,
    transposed: bool,
    ce: CeParams,
    kept: Option<ValueId>,
}

/// Whether `v`'s only reader is `user` and `v` is no output.
fn read_only_by(graph: &Graph, v: ValueId, user: ValueId) -> bool {
    graph.users(v) == [user] && graph.outputs.iter().all(|(_, o)| *o != v)
}

/// The head to fuse at cross-entropy node `ce`, if its logits are a matmul of hidden states
/// by a rank-2 weight that only `ce` reads.
fn head_at(graph: &Graph, loss: ValueId) -> Option<Head> {
    let node = graph.node(loss);
    let (&Op::CrossEntropy(ce), &[logits, _, ref kept @ ..]) = (&node.op, node.inputs.as_slice())
    else {
        return None;
    };
    let mm = graph.node(logits);
    let (
        &Op::MatMul {
            ta: false,
            tb,
            f32_out: false,
            bias: false,
        },
        &[x, b],
    ) = (&mm.op, mm.inputs.as_slice())
    else {
        return None;
    };
    if !read_only_by(graph, logits, loss) || graph.node(b).ty.shape.len() != 2 {
        return None;
    }
    let wn = graph.node(b);
    let (w, transposed, transpose) = match (&wn.op, wn.inputs.as_slice()) {
        _ if tb => (b, true, None),
        (Op::Permute { perm }, &[e]) if perm == &[1, 0] => (e, true, Some(b)),
        _ => (b, false, None),
    };
    Some(Head {
        matmul: logits,
        transpose,
        x,
        w,
        transposed,
        ce,
        kept: kept.first().copied(),
    })
}

/// `graph` with every fusable loss head fused. `hidden` is the dtype the hidden states will
/// have (the low precision under mixed precision), which sizes the default chunk; `None`
/// takes their dtype in `graph`.
pub fn run(graph: &Graph, hidden: Option<DType>) -> Result<Graph, StageError> {
    let heads: Vec<(ValueId, Head)> = graph
        .values()
        .filter_map(|v| head_at(graph, v).map(|h| (v, h)))
        .collect();
    // The fused matmuls, and the transposes only they read.
    let mut skipped: Vec<ValueId> = heads.iter().map(|(_, h)| h.matmul).collect();
    for t in heads.iter().filter_map(|(_, h)| h.transpose) {
        let unread = graph.users(t).iter().all(|u| skipped.contains(u));
        if unread && graph.outputs.iter().all(|(_, o)| *o != t) && !skipped.contains(&t) {
            skipped.push(t);
        }
    }
    let mut out = Graph::new();
    // Old value -> new value; `None` for the matmuls and transposes fused away.
    let mut map: Vec<Option<ValueId>> = Vec::with_capacity(graph.len());
    let mapped = |map: &[Option<ValueId>], v: ValueId| {
        map[v.index()].ok_or_else(|| {
            StageError::internal("fuse_loss", format!("{v} was fused away but is still read"))
        })
    };
    for v in graph.values() {
        let node = graph.node(v);
        let origin = node.origin();
        let new = match heads.iter().find(|(ce, _)| *ce == v) {
            Some((_, h)) => {
                let inputs = [h.x, h.w, node.inputs[1]].map(|i| mapped(&map, i));
                let [x, w, t] = inputs;
                let kept = h.kept.map(|k| mapped(&map, k)).transpose()?;
                let inputs = [x?, w?, t?];
                Some(fused(&mut out, graph, h, (inputs, kept), hidden, &origin)?)
            }
            None if skipped.contains(&v) => None,
            None => {
                let inputs = node.inputs.iter().map(|&i| mapped(&map, i));
                let inputs = inputs.collect::<Result<_, _>>()?;
                Some(
                    out.add(node.op.clone(), inputs, &origin)
                        .map_err(internal)?,
                )
            }
        };
        map.push(new);
    }
    out.outputs = graph
        .outputs
        .iter()
        .map(|(name, v)| Ok((name.clone(), mapped(&map, *v)?)))
        .collect::<Result<_, StageError>>()?;
    Ok(out)
}

/// Adds `mean(linear_cross_entropy(x, w, targets))` for head `h` to `out`, over the new
/// values `inputs` of its hidden states, weight and targets; with an ignored id, the sum of
/// the rows divided by `kept`, the new value of the head's count of kept rows.
fn fused(
    out: &mut Graph,
    graph: &Graph,
    h: &Head,
    (inputs, kept): ([ValueId; 3], Option<ValueId>),
    hidden: Option<DType>,
    origin: &Origin,
) -> Result<ValueId, StageError> {
    let x = &graph.node(h.x).ty;
    let rows = out.node(inputs[2]).ty.numel() as usize;
    let dim = x.shape.last().copied().unwrap_or(1);
    let classes = graph.node(h.matmul).ty.shape.last().copied().unwrap_or(1);
    let elem = hidden.unwrap_or(x.dtype).size() as usize;
    let lce = LinearCe {
        chunk: default_chunk(rows, dim, classes, elem),
        transposed: h.transposed,
        ce: h.ce,
    };
    let per_row = out
        .add(Op::LinearCrossEntropy(lce), inputs.to_vec(), origin)
        .map_err(internal)?;
    let sum = out
        .add(Op::sum_to(vec![]), vec![per_row], origin)
        .map_err(internal)?;
    let (mean, inputs) = match kept {
        Some(kept) => (Op::Binary(BinaryFn::Div), vec![sum, kept]),
        None => (
            Op::Affine {
                scale: 1.0 / rows.max(1) as f32,
                shift: 0.0,
            },
            vec![sum],
        ),
    };
    out.add(mean, inputs, origin).map_err(internal)
}

/// `graph` (any phase) with the chunk of every linear cross-entropy op halved, or `None` when
/// every chunk is already one row (or there is none).
pub fn halve_chunks(graph: &Graph) -> Option<Graph> {
    let halve = |lce: &LinearCe| LinearCe {
        chunk: lce.chunk / 2,
        ..*lce
    };
    let mut any = false;
    let mut out = Graph::new();
    for v in graph.values() {
        let node = graph.node(v);
        let op = match &node.op {
            Op::LinearCrossEntropy(lce) if lce.chunk > 1 => {
                any = true;
                Op::LinearCrossEntropy(halve(lce))
            }
            Op::LinearCrossEntropyBackward { lce, which } if lce.chunk > 1 => {
                Op::LinearCrossEntropyBackward {
                    lce: halve(lce),
                    which: *which,
                }
            }
            op => op.clone(),
        };
        let origin = node.origin();
        // Same ops on the same inputs in the same order: every id maps to itself.
        out.add(op, node.inputs.clone(), &origin).ok()?;
    }
    out.outputs = graph.outputs.clone();
    any.then_some(out)
}
