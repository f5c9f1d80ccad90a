//! Shape and dtype rule, cost and precision class of the losses (cross-entropy, mean squared
//! error) and their backward ops.

use crate::ir::{DType, Op, TensorType};
use crate::ops::rules::{
    arity, elementwise_flops, fail, first_numel, float, foreign, int, rank_at_least, same_dtype,
    same_shape, Behaviour, PrecisionClass, Result, Rules,
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
            Op::CrossEntropy => (cross_entropy, false),
            Op::CrossEntropyBackward => (cross_entropy, true),
            Op::Mse => (mse, false),
            Op::MseBackward => (mse, true),
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
            Op::CrossEntropy | Op::CrossEntropyBackward => 5 * first_numel(inputs),
            _ => elementwise_flops(inputs, out),
        }
    }

    fn behaviour(&self, op: &Op) -> Behaviour {
        match op {
            Op::CrossEntropy => Behaviour::CHEAP.in_precision(PrecisionClass::AsIs),
            _ => Behaviour::CHEAP,
        }
    }
}
