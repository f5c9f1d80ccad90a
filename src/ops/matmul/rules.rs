//! Shape and dtype rule, cost and precision class of the batched matmul.

use crate::ir::{broadcast, DType, Op, TensorType};
use crate::ops::rules::{
    arity, fail, float, foreign, rank_at_least, same_dtype, Behaviour, PrecisionClass, Result,
    Rules,
};

/// `op(a) @ op(b)` with the last two dims transposed where `ta`/`tb`, batch dims broadcast.
fn matmul(a: &TensorType, b: &TensorType, ta: bool, tb: bool) -> Result<TensorType> {
    rank_at_least(a, 2, "matmul operand")?;
    rank_at_least(b, 2, "matmul operand")?;
    float(a, "matmul operand")?;
    same_dtype(a, b)?;
    let (ra, rb) = (a.shape.len(), b.shape.len());
    let (m, ka) = if ta {
        (a.shape[ra - 1], a.shape[ra - 2])
    } else {
        (a.shape[ra - 2], a.shape[ra - 1])
    };
    let (kb, n) = if tb {
        (b.shape[rb - 1], b.shape[rb - 2])
    } else {
        (b.shape[rb - 2], b.shape[rb - 1])
    };
    if ka != kb {
        return fail(
            format!("shape mismatch in matmul: {a} @ {b} (inner dims {ka} and {kb})"),
            "the last dim of the left operand must equal the second-to-last of the right",
        );
    }
    let Some(mut batch) = broadcast(&a.shape[..ra - 2], &b.shape[..rb - 2]) else {
        return fail(
            format!("matmul batch dims do not broadcast: {a} @ {b}"),
            "batch dims must be equal or 1",
        );
    };
    batch.extend([m, n]);
    Ok(TensorType::new(a.dtype, batch))
}

/// The flat output of a [`Op::MatMulBiasGrad`] of 2-D operands: the `m x n` product, then
/// (at [`super::bias_grad_offset`]) the `n` sums over `k` of `op(b)`.
fn with_bias_grad(a: &TensorType, b: &TensorType, ta: bool, tb: bool) -> Result<TensorType> {
    if a.shape.len() != 2 || b.shape.len() != 2 {
        return fail(
            format!("matmul with a bias gradient over {a} @ {b}"),
            "both operands of a product with a bias gradient are matrices",
        );
    }
    let out = matmul(a, b, ta, tb)?;
    let (m, n) = (out.shape[0] as u64, out.shape[1] as u64);
    let total = super::bias_grad_offset(m * n) + n;
    Ok(TensorType::new(out.dtype, vec![total as usize]))
}

impl Rules for super::Family {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
        if let Op::MatMulBiasGrad { ta, tb, f32_out } = op {
            arity(op, inputs, 2, 2)?;
            let out = with_bias_grad(inputs[0], inputs[1], *ta, *tb)?;
            return Ok(match f32_out {
                true => out.with_dtype(DType::F32),
                false => out,
            });
        }
        let Op::MatMul {
            ta,
            tb,
            f32_out,
            bias,
        } = op
        else {
            return foreign(op, "matmul");
        };
        let n = if *bias { 3 } else { 2 };
        arity(op, inputs, n, n)?;
        let out = matmul(inputs[0], inputs[1], *ta, *tb)?;
        let out = if *f32_out {
            out.with_dtype(DType::F32)
        } else {
            out
        };
        if let Some(b) = inputs.get(2) {
            let cols = out.shape.last().copied().unwrap_or(0);
            if b.dtype != out.dtype || b.shape != [cols] {
                return fail(
                    format!("matmul bias {b} does not match its output {out}"),
                    "the bias is a vector of the output's last dim in the output's type",
                );
            }
        }
        Ok(out)
    }

    fn flops(&self, op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
        if let (Op::MatMulBiasGrad { ta, tb, .. }, [a, b]) = (op, inputs) {
            let product = matmul(a, b, *ta, *tb).map_or(0, |p| p.numel());
            let k = if *ta { a.shape[0] } else { a.shape[1] } as u64;
            return 2 * product * k + b.numel();
        }
        let (Op::MatMul { ta, .. }, Some(a)) = (op, inputs.first()) else {
            return 0;
        };
        let r = a.shape.len();
        let k = if *ta { a.shape[r - 2] } else { a.shape[r - 1] };
        let bias = if inputs.len() > 2 { out.numel() } else { 0 };
        2 * out.numel() * k as u64 + bias
    }

    /// cuBLASLt GEMMs: on tensor cores in 16 bits.
    fn behaviour(&self, _op: &Op) -> Behaviour {
        Behaviour::LIBRARY_GEMM.in_precision(PrecisionClass::Low)
    }
}
