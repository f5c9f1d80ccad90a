//! Casts folded into the ops that produce them. Widening: in a mixed-precision step, a
//! weight's gradient is a bf16/fp16 matmul (`x^T @ dy`) cast to the fp32 gradient, a bias's
//! a bf16/fp16 `sum_to` of `dy` cast the same way. The matmul stores its fp32 accumulator
//! instead (`Op::MatMul { f32_out: true }`), the sum its fp32 sum (`Op::SumTo { f32_out:
//! true }`), so the low-precision gradient never exists beside its fp32 copy (the bytes of
//! both at once were the peak of small mixed-precision steps), the gradient skips one
//! rounding to bf16/fp16 and the cast is no kernel launch. Only backward nodes are widened:
//! a forward output may be saved for backward, where its low-precision form is the smaller
//! one. Narrowing ([`narrow_norms`], before autodiff): a norm computed in fp32 whose only
//! reader casts it to bf16/fp16 stores that precision itself (`Op::Norm { store }`), rounded
//! once as the cast rounded it, so the values are the same bits without the fp32 copy.

use super::autodiff::Differentiated;
use super::rewrite::{rebuild, remap_pairs, Edit};
use super::StageError;
use crate::ir::*;
use std::collections::BTreeSet;

/// Whether `op` can store its fp32 accumulator in place of its low-precision output.
fn widens(op: &Op) -> bool {
    matches!(
        op,
        Op::MatMul { f32_out: false, .. } | Op::SumTo { f32_out: false, .. }
    )
}

/// The casts `cast_ok` accepts whose source is the only reader's `source_ok` producer and
/// no graph output: (sources, casts).
fn foldable(
    graph: &Graph,
    cast_ok: impl Fn(&Node, DType) -> bool,
    source_ok: impl Fn(&Node) -> bool,
) -> (BTreeSet<ValueId>, BTreeSet<ValueId>) {
    let outputs: BTreeSet<ValueId> = graph.outputs.iter().map(|(_, v)| *v).collect();
    let mut sources = BTreeSet::new();
    let mut casts = BTreeSet::new();
    for c in graph.values() {
        let node = graph.node(c);
        let (Op::Cast { to }, &[m]) = (&node.op, node.inputs.as_slice()) else {
            continue;
        };
        if cast_ok(node, *to)
            && source_ok(graph.node(m))
            && graph.users(m) == [c]
            && !outputs.contains(&m)
        {
            sources.insert(m);
            casts.insert(c);
        }
    }
    (sources, casts)
}

/// `graph` with each of `casts` removed (its readers read its source) and each of `sources`
/// rewritten by `fold` (given its id) to the cast's output type: the new graph and each old
/// value's new one.
fn fold(
    graph: &Graph,
    (sources, casts): (BTreeSet<ValueId>, BTreeSet<ValueId>),
    fold: impl Fn(ValueId, &Op) -> Op,
) -> Result<(Graph, Vec<Option<ValueId>>), StageError> {
    rebuild(graph, "widen", |v| {
        let node = graph.node(v);
        if casts.contains(&v) {
            Edit::Alias(node.inputs[0])
        } else if sources.contains(&v) {
            Edit::Rebuild(fold(v, &node.op), node.inputs.clone())
        } else {
            Edit::Keep
        }
    })
}

/// `diff` with every cast to fp32 of a low-precision backward matmul or sum removed and that
/// op writing fp32; gradients, outputs and every other node keep their meaning (ids are
/// renumbered).
pub fn run(diff: &Differentiated) -> Result<Differentiated, StageError> {
    let graph = &diff.graph;
    let candidates = foldable(
        graph,
        |cast, to| to == DType::F32 && cast.phase == Phase::Backward,
        |source| {
            source.phase == Phase::Backward
                && matches!(source.ty.dtype, DType::BF16 | DType::F16)
                && widens(&source.op)
        },
    );
    let (out, map) = fold(graph, candidates, |_, op| match op {
        Op::MatMul { ta, tb, bias, .. } => Op::MatMul {
            ta: *ta,
            tb: *tb,
            f32_out: true,
            bias: *bias,
        },
        Op::SumTo { shape, .. } => Op::SumTo {
            shape: shape.clone(),
            f32_out: true,
        },
        op => op.clone(),
    })?;
    let grads = remap_pairs(&diff.grads, &map, "widen")?;
    Ok(Differentiated {
        graph: out,
        grads,
        alternatives: Vec::new(),
    })
}

/// `graph` (forward, before autodiff) with every cast to bf16/fp16 of an fp32 norm removed and
/// the norm storing that precision; returns the graph and each old value's new one.
pub fn narrow_norms(graph: &Graph) -> Result<(Graph, Vec<Option<ValueId>>), StageError> {
    let candidates = foldable(
        graph,
        |_, to| matches!(to, DType::BF16 | DType::F16),
        |source| source.ty.dtype == DType::F32 && matches!(source.op, Op::Norm { store: None, .. }),
    );
    fold(graph, candidates, |norm, op| match op {
        Op::Norm { kind, eps, .. } => Op::Norm {
            kind: *kind,
            eps: *eps,
            store: graph.users(norm).first().map(|c| graph.node(*c).ty.dtype),
        },
        op => op.clone(),
    })
}
