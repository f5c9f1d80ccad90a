//! FLOP counts per op (multiply-add = 2), for the report and recomputation trade-offs.

use super::{Op, TensorType};

/// FLOPs of one execution of `op` on inputs of the given types producing `out`.
pub fn flops(op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
    crate::ops::family(op).flops(op, inputs, out)
}

pub(crate) fn flops_legacy(op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
    use Op::*;
    let n = out.numel();
    let first = inputs.first().map(|t| t.numel()).unwrap_or(0);
    match op {
        Input { .. } | Param { .. } | OptimState { .. } | Reshape { .. } => 0,
        MatMul { ta, .. } => {
            let a = inputs[0];
            let r = a.shape.len();
            let k = if *ta { a.shape[r - 2] } else { a.shape[r - 1] };
            2 * n * k as u64
        }
        Conv2d(c) => {
            let w = inputs[1];
            2 * n * (w.shape[1] * w.shape[2] * w.shape[3]) as u64 / c.groups.max(1) as u64
                * c.groups.max(1) as u64
        }
        Conv2dBackwardInput { .. } => {
            let (dy, w) = (inputs[0], inputs[1]);
            2 * dy.numel() * (w.shape[1] * w.shape[2] * w.shape[3]) as u64
        }
        Conv2dBackwardWeight { .. } => {
            let dy = inputs[1];
            2 * dy.numel() * (out.shape[1] * out.shape[2] * out.shape[3]) as u64
        }
        Attention(a) | AttentionBackward { attn: a, .. } => {
            let (q, k) = (inputs[0], inputs[1]);
            let pairs = (q.shape[0] * q.shape[1] * k.shape[1]) as u64;
            let width = q.shape[2] as u64;
            let dense = 4 * pairs * width;
            let fwd = if a.causal { dense / 2 } else { dense };
            if matches!(op, Attention(_)) {
                fwd
            } else {
                fwd * 3 / 2
            }
        }
        Norm { .. } | NormBackwardInput { .. } | NormBackwardWeight { .. } => 8 * first,
        Softmax { .. }
        | LogSoftmax { .. }
        | SoftmaxBackward { .. }
        | LogSoftmaxBackward { .. }
        | CrossEntropy
        | CrossEntropyBackward => 5 * first,
        AccumulateGrad { .. } => 2 * first,
        ClipCoefficient { .. } | UnscaleGrads => 2 * inputs.iter().map(|t| t.numel()).sum::<u64>(),
        AdamW(_) => 12 * first,
        Sgd(_) => 4 * first,
        Unary(_) | UnaryBackward(_) => 4 * n,
        _ => n.max(first),
    }
}
