//! Widening casts folded into the matmuls they read: in a mixed-precision step, a weight's
//! gradient is a bf16/fp16 matmul (`x^T @ dy`) cast to the fp32 gradient. The matmul stores
//! its fp32 accumulator instead (`Op::MatMul { f32_out: true }`), so the low-precision
//! gradient never exists beside its fp32 copy (the bytes of both at once were the peak of
//! small mixed-precision steps) and the gradient skips one rounding to bf16/fp16. Only
//! backward nodes are folded: a forward matmul output may be saved for backward, where its
//! low-precision form is the smaller one.

use super::autodiff::Differentiated;
use super::StageError;
use crate::ir::*;
use std::collections::BTreeSet;

/// The low-precision backward matmuls whose only reader is a cast to fp32 (and that are no
/// graph output), with those casts.
fn foldable(graph: &Graph) -> (BTreeSet<ValueId>, BTreeSet<ValueId>) {
    let outputs: BTreeSet<ValueId> = graph.outputs.iter().map(|(_, v)| *v).collect();
    let mut matmuls = BTreeSet::new();
    let mut casts = BTreeSet::new();
    for c in graph.values() {
        let node = graph.node(c);
        let (Op::Cast { to: DType::F32 }, &[m]) = (&node.op, node.inputs.as_slice()) else {
            continue;
        };
        let source = graph.node(m);
        let low = matches!(source.ty.dtype, DType::BF16 | DType::F16);
        if node.phase == Phase::Backward
            && source.phase == Phase::Backward
            && low
            && matches!(source.op, Op::MatMul { f32_out: false, .. })
            && graph.users(m) == [c]
            && !outputs.contains(&m)
        {
            matmuls.insert(m);
            casts.insert(c);
        }
    }
    (matmuls, casts)
}

/// `diff` with every foldable cast removed and its matmul writing fp32; gradients, outputs
/// and every other node keep their meaning (ids are renumbered).
pub fn run(diff: &Differentiated) -> Result<Differentiated, StageError> {
    let graph = &diff.graph;
    let (matmuls, casts) = foldable(graph);
    let mut out = Graph::new();
    let mut map: Vec<Option<ValueId>> = vec![None; graph.len()];
    let mapped = |map: &[Option<ValueId>], v: ValueId| {
        map[v.index()]
            .ok_or_else(|| StageError::internal("widen", format!("{v} used before it was built")))
    };
    for v in graph.values() {
        let node = graph.node(v);
        if casts.contains(&v) {
            map[v.index()] = Some(mapped(&map, node.inputs[0])?);
            continue;
        }
        let op = match node.op {
            Op::MatMul { ta, tb, .. } if matmuls.contains(&v) => Op::MatMul {
                ta,
                tb,
                f32_out: true,
            },
            ref op => op.clone(),
        };
        let inputs = node
            .inputs
            .iter()
            .map(|&i| mapped(&map, i))
            .collect::<Result<Vec<_>, _>>()?;
        let origin = node.origin();
        let id = out
            .add(op, inputs, &origin)
            .map_err(|e| StageError::internal("widen", format!("{v}: {}", e.message)))?;
        map[v.index()] = Some(id);
    }
    for (name, v) in &graph.outputs {
        out.outputs.push((name.clone(), mapped(&map, *v)?));
    }
    let grads = diff
        .grads
        .iter()
        .map(|&(p, g)| Ok((mapped(&map, p)?, mapped(&map, g)?)))
        .collect::<Result<Vec<_>, StageError>>()?;
    Ok(Differentiated {
        graph: out,
        grads,
        alternatives: Vec::new(),
    })
}
