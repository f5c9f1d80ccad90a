//! Shape and dtype rule, cost and precision class of the losses (cross-entropy, mean squared
//! error, the fused linear cross-entropy), their backward ops and the count of kept rows.

use super::{CeParams, LceGrad, LinearCe};
use crate::ir::{DType, Op, TensorType};
use crate::ops::rules::{
    arity, elementwise_flops, fail, first_numel, float, foreign, int, rank_at_least, rank_exactly,
    same_dtype, same_shape, Behaviour, PrecisionClass, Result, Rules,
};

/// Checks cross-entropy's operands: floating logits `[..., C]`, i32 targets `[...]`.
fn cross_entropy(logits: &TensorType, targets: &TensorType) -> Result<()> {
    rank_at_least(logits, 1, "cross_entropy logits")?;
    float(logits, "cross_entropy logits")?;
    int(targets, "cross_entropy targets")?;
    if targets.shape != logits.shape[..logits.shape.len() - 1] {
        return fail(
            format!("cross_entropy targets {targets} do not match logits {logits}"),
            "targets must have the logits' shape without the class dim",
        );
    }
    Ok(())
}

/// `(rows, dim, classes)` of a linear cross-entropy head: floating hidden states `[..., D]`
/// and weight `[D, V]` (`[V, D]` when transposed) of one dtype, i32 targets of the hidden
/// states' shape without `D`, and a chunk of at least one row.
pub(super) fn linear_ce(lce: &LinearCe, inputs: &[&TensorType]) -> Result<(u64, u64, u64)> {
    let &[x, w, targets, ..] = inputs else {
        return fail(
            format!(
                "linear_cross_entropy takes at least 3 inputs, got {}",
                inputs.len()
            ),
            "check the number of arguments",
        );
    };
    rank_at_least(x, 1, "linear_cross_entropy hidden states")?;
    float(x, "linear_cross_entropy hidden states")?;
    rank_exactly(w, 2, "linear_cross_entropy weight")?;
    same_dtype(x, w)?;
    int(targets, "linear_cross_entropy targets")?;
    let dim = x.shape[x.shape.len() - 1];
    let (wd, classes) = if lce.transposed {
        (w.shape[1], w.shape[0])
    } else {
        (w.shape[0], w.shape[1])
    };
    if wd != dim {
        return fail(
            format!("linear_cross_entropy weight {w} does not match hidden states {x}"),
            "the weight's input dim must be the hidden states' last dim",
        );
    }
    if targets.shape != x.shape[..x.shape.len() - 1] {
        return fail(
            format!("linear_cross_entropy targets {targets} do not match hidden states {x}"),
            "targets must have the hidden states' shape without the last dim",
        );
    }
    if lce.chunk == 0 {
        return fail(
            "linear_cross_entropy chunk of 0 rows",
            "a chunk holds at least one row",
        );
    }
    Ok((targets.numel(), dim as u64, classes as u64))
}

/// The type of a linear cross-entropy op: per-row f32 losses, or the differentiated operand's
/// type for a backward op (which also reads the per-row losses and their gradient, f32 of
/// the targets' shape).
fn linear_ce_type(op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
    let (lce, which) = match op {
        Op::LinearCrossEntropy(lce) => (lce, None),
        Op::LinearCrossEntropyBackward { lce, which } => (lce, Some(*which)),
        _ => return foreign(op, "loss"),
    };
    let n = if which.is_some() { 5 } else { 3 };
    arity(op, inputs, n, n)?;
    linear_ce(lce, inputs)?;
    let rows = TensorType::new(DType::F32, inputs[2].shape.clone());
    if which.is_some() && (inputs[3] != &rows || inputs[4] != &rows) {
        return fail(
            format!(
                "linear_cross_entropy backward reads {} and {}, not {rows} per-row losses and gradients",
                inputs[3], inputs[4]
            ),
            "the per-row losses and their gradient are f32 of the targets' shape",
        );
    }
    Ok(match which {
        None => rows,
        Some(LceGrad::Input) => inputs[0].clone(),
        Some(LceGrad::Weight) => inputs[1].clone(),
        Some(LceGrad::Both) => {
            let (x, w) = (inputs[0], inputs[1]);
            let (_, len) = crate::ops::packed_pair(x.numel(), w.numel(), x.dtype.size());
            TensorType::new(x.dtype, vec![len as usize])
        }
    })
}

/// The type of a cross-entropy op over `inputs`: logits and targets, then (backward) the
/// loss's gradient, then (with an ignored id) the f32 scalar count of kept rows. A scalar for
/// the forward, the logits' type for the backward.
fn cross_entropy_type(
    ce: &CeParams,
    backward: bool,
    op: &Op,
    inputs: &[&TensorType],
) -> Result<TensorType> {
    let n = ce.inputs(backward);
    arity(op, inputs, n, n)?;
    cross_entropy(inputs[0], inputs[1])?;
    let scalar = TensorType::new(DType::F32, vec![]);
    if ce.ignore_index.is_some() && inputs[n - 1] != &scalar {
        return fail(
            format!(
                "cross_entropy reads {} as its count of kept rows",
                inputs[n - 1]
            ),
            "the count of kept rows is the f32 scalar `kept_count` of the targets",
        );
    }
    Ok(if backward { inputs[0].clone() } else { scalar })
}

/// Checks mse's operands: floating, of one dtype and shape.
fn mse(a: &TensorType, b: &TensorType) -> Result<()> {
    float(a, "mse operand")?;
    same_dtype(a, b)?;
    same_shape(a, b, "mse")
}

/// A check of a loss's two operands.
type OperandCheck = fn(&TensorType, &TensorType) -> Result<()>;

impl Rules for super::Family {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
        let (check, backward): (OperandCheck, bool) = match op {
            Op::CrossEntropy(ce) => return cross_entropy_type(ce, false, op, inputs),
            Op::CrossEntropyBackward(ce) => return cross_entropy_type(ce, true, op, inputs),
            Op::KeptCount(_) => {
                arity(op, inputs, 1, 1)?;
                // It counts a cross-entropy's targets, and is named after them.
                int(inputs[0], "cross_entropy targets")?;
                return Ok(TensorType::new(DType::F32, vec![]));
            }
            Op::Mse => (mse, false),
            Op::MseBackward => (mse, true),
            Op::LinearCrossEntropy(_) | Op::LinearCrossEntropyBackward { .. } => {
                return linear_ce_type(op, inputs)
            }
            _ => return foreign(op, "loss"),
        };
        // A backward op also reads the loss's gradient and returns the first operand's type.
        let n = if backward { 3 } else { 2 };
        arity(op, inputs, n, n)?;
        check(inputs[0], inputs[1])?;
        Ok(if backward {
            inputs[0].clone()
        } else {
            TensorType::new(DType::F32, vec![])
        })
    }

    fn flops(&self, op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
        match op {
            Op::CrossEntropy(_) | Op::CrossEntropyBackward(_) => 5 * first_numel(inputs),
            Op::KeptCount(_) => first_numel(inputs),
            // The logits (2NDV) and their log-sum-exp (5 per logit, as cross-entropy counts
            // it); each backward op recomputes both and adds its own product with the
            // gradient of the logits (another 2NDV): the head's backward costs two
            // recomputations of the logits, or one when merged.
            Op::LinearCrossEntropy(lce) | Op::LinearCrossEntropyBackward { lce, .. } => {
                let Ok((n, d, v)) = linear_ce(lce, inputs) else {
                    return 0;
                };
                let forward = 2 * n * d * v + 5 * n * v;
                match op {
                    Op::LinearCrossEntropy(_) => forward,
                    Op::LinearCrossEntropyBackward {
                        which: LceGrad::Both,
                        ..
                    } => forward + 4 * n * d * v,
                    _ => forward + 2 * n * d * v,
                }
            }
            _ => elementwise_flops(inputs, out),
        }
    }

    fn behaviour(&self, op: &Op) -> Behaviour {
        match op {
            Op::CrossEntropy(_) | Op::KeptCount(_) => {
                Behaviour::CHEAP.in_precision(PrecisionClass::AsIs)
            }
            // Hidden states and weight in the low precision, as matmul reads them.
            // Its logits are cuBLASLt GEMMs.
            Op::LinearCrossEntropy(_) => Behaviour::LIBRARY_GEMM.in_precision(PrecisionClass::Low),
            Op::LinearCrossEntropyBackward { .. } => Behaviour::LIBRARY_GEMM,
            _ => Behaviour::CHEAP,
        }
    }
}
