//! `--quantize-frozen int8|nf4`: every frozen 2-D parameter read only by matmuls (the base
//! weights under `--lora`, `frozen` params, `--freeze` matches; not embeddings, norms,
//! biases or a weight the fused loss head reads) is stored packed in a `u8` buffer
//! (`crate::ops::quant::pack`), and a `Dequantize` made just before its first matmul gives
//! the weight in the precision the matmuls read. Runs after mixed precision (a frozen weight
//! is then already in its compute precision) and before autodiff, which never differentiates
//! it (frozen); backward recomputes the dequantized weight from the packed buffer
//! (`checkpoint::weight_copies`), so no dequantized weight is saved for backward.

use crate::diagnostic::UserError;
use crate::ir::{DType, Graph, Op, Quantized, Scheme, TensorType, ValueId};
use crate::passes::StageError;

/// Why the pass failed: nothing to quantize (the user's), or a broken invariant.
#[derive(Debug, Clone)]
pub enum QuantizeError {
    User(UserError),
    Internal(StageError),
}

/// How `p` would be packed under `scheme`: a frozen 2-D float parameter whose readers are all
/// matmuls (output channels taken from the first's orientation), else None.
fn candidate(graph: &Graph, p: ValueId, scheme: Scheme) -> Option<Quantized> {
    let node = graph.node(p);
    let Op::Param { frozen: true, .. } = node.op else {
        return None;
    };
    let shape: [usize; 2] = node.ty.shape.as_slice().try_into().ok()?;
    let users = graph.users(p);
    let all_matmuls = users
        .iter()
        .all(|&u| matches!(graph.node(u).op, Op::MatMul { .. }));
    let first = users.first()?;
    let Op::MatMul { ta, tb, .. } = graph.node(*first).op else {
        return None;
    };
    // As `b` of `x @ W` columns are output channels ([in, out]); of `x @ W^T` rows are.
    let out_axis = if graph.node(*first).inputs.get(1) == Some(&p) {
        usize::from(!tb)
    } else {
        usize::from(ta)
    };
    (node.ty.dtype.is_float() && all_matmuls).then_some(Quantized {
        scheme,
        shape,
        out_axis,
    })
}

/// A graph with its frozen weights quantized, and where each value of the graph it was
/// rewritten from went.
#[derive(Debug, Clone)]
pub struct Rewritten {
    pub graph: Graph,
    /// Old value -> new value (a quantized parameter's packed buffer).
    pub map: Vec<ValueId>,
}

/// `graph` with every frozen weight that only matmuls read stored quantized under `scheme`.
/// Finding none is a user error saying what qualifies.
pub fn run(graph: &Graph, scheme: Scheme) -> Result<Rewritten, QuantizeError> {
    let internal = |e: crate::ir::TypeError| {
        QuantizeError::Internal(StageError::internal("quantize", e.message))
    };
    let quantized: Vec<Option<Quantized>> = graph
        .values()
        .map(|v| candidate(graph, v, scheme))
        .collect();
    if quantized.iter().all(Option::is_none) {
        return Err(QuantizeError::User(UserError::general(
            format!("--quantize-frozen {scheme} finds no weight to quantize"),
            "it stores frozen 2-D parameters that only matmuls read (the base weights under \
             --lora, `frozen` parameters, --freeze matches): freeze some, or drop the flag",
        )));
    }
    let mut out = Graph::new();
    let mut map: Vec<ValueId> = Vec::with_capacity(graph.len());
    // For a quantized parameter: its dequantized weight, once its first reader made it.
    let mut dequantized: Vec<Option<ValueId>> = vec![None; graph.len()];
    for v in graph.values() {
        let node = graph.node(v);
        let origin = node.origin();
        if let (Some(q), Op::Param { name, init, .. }) = (quantized[v.index()], &node.op) {
            let packed = Op::Param {
                name: name.clone(),
                ty: TensorType::new(DType::U8, vec![q.packed_bytes() as usize]),
                init: *init,
                frozen: true,
                buffer: false,
            };
            map.push(out.add(packed, vec![], &origin).map_err(internal)?);
            continue;
        }
        let mut inputs = Vec::with_capacity(node.inputs.len());
        for &i in &node.inputs {
            let Some(q) = quantized[i.index()] else {
                inputs.push(map[i.index()]);
                continue;
            };
            let w = match dequantized[i.index()] {
                Some(w) => w,
                None => {
                    let to = graph.node(i).ty.dtype;
                    let op = Op::Dequantize { quant: q, to };
                    let w = out
                        .add(op, vec![map[i.index()]], &origin)
                        .map_err(internal)?;
                    dequantized[i.index()] = Some(w);
                    w
                }
            };
            inputs.push(w);
        }
        map.push(
            out.add(node.op.clone(), inputs, &origin)
                .map_err(internal)?,
        );
    }
    out.outputs = (graph.outputs.iter())
        .map(|(name, v)| (name.clone(), map[v.index()]))
        .collect();
    Ok(Rewritten { graph: out, map })
}

/// The quantized weights of a compiled graph, summed (None when it quantizes none).
pub fn summary(graph: &Graph) -> Option<crate::plan::QuantSummary> {
    let mut sum: Option<crate::plan::QuantSummary> = None;
    for (quant, to) in graph
        .params()
        .into_iter()
        .filter_map(|p| dequantized(graph, p))
    {
        let s = sum.get_or_insert(crate::plan::QuantSummary {
            scheme: quant.scheme,
            tensors: 0,
            weights: 0,
            packed_bytes: 0,
            unpacked_bytes: 0,
        });
        s.tensors += 1;
        s.weights += quant.numel();
        s.packed_bytes += quant.packed_bytes();
        s.unpacked_bytes += quant.numel() * to.size();
    }
    sum
}

/// How parameter `p` of a compiled graph is packed and the precision it dequantizes to, from
/// its `Dequantize` readers; None for a parameter stored as it is.
fn dequantized(graph: &Graph, p: ValueId) -> Option<(Quantized, DType)> {
    graph.users(p).iter().find_map(|&u| match graph.node(u).op {
        Op::Dequantize { quant, to } => Some((quant, to)),
        _ => None,
    })
}

/// How parameter `p` of a compiled graph is packed: the quantization its `Dequantize`
/// readers name, None for a parameter stored as it is.
pub fn packing(graph: &Graph, p: ValueId) -> Option<Quantized> {
    dequantized(graph, p).map(|(q, _)| q)
}

/// The number of values parameter `p` holds: its weight's, when it is stored quantized.
pub fn weights(graph: &Graph, p: ValueId) -> u64 {
    packing(graph, p).map_or(graph.node(p).ty.numel(), |q| q.numel())
}
