//! Shape and dtype rule, cost and precision class of the pointwise ops.

use crate::ir::{broadcast, Op, TensorType, UnaryFn};
use crate::ops::rules::{
    arity, elementwise_flops, fail, float, foreign, same_dtype, same_shape, Behaviour,
    PrecisionClass, Result, Rules,
};

impl Rules for super::Family {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
        match op {
            Op::Unary(_) | Op::Affine { .. } | Op::Clamp(_) => {
                arity(op, inputs, 1, 1)?;
                float(inputs[0], "operand")?;
                Ok(inputs[0].clone())
            }
            Op::UnaryBackward(_) | Op::UnaryOutputBackward(_) | Op::ClampBackward(_) => {
                arity(op, inputs, 2, 2)?;
                same_shape(inputs[0], inputs[1], op.name())?;
                float(inputs[0], "operand")?;
                Ok(inputs[0].clone())
            }
            Op::Binary(_) => {
                arity(op, inputs, 2, 2)?;
                broadcast_all(inputs)
            }
            Op::Where => {
                arity(op, inputs, 3, 3)?;
                broadcast_all(inputs)
            }
            _ => foreign(op, "pointwise"),
        }
    }

    fn flops(&self, op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
        match op {
            Op::Unary(_) | Op::UnaryBackward(_) | Op::UnaryOutputBackward(_) => 4 * out.numel(),
            Op::Clamp(_) | Op::ClampBackward(_) => 2 * out.numel(),
            _ => elementwise_flops(inputs, out),
        }
    }

    fn behaviour(&self, op: &Op) -> Behaviour {
        match op {
            // autocast's fp32 list (softplus among them, as torch.autocast runs it).
            Op::Unary(
                UnaryFn::Exp
                | UnaryFn::Log
                | UnaryFn::Sqrt
                | UnaryFn::Rsqrt
                | UnaryFn::Softplus
                | UnaryFn::Reciprocal,
            ) => Behaviour::CHEAP.in_precision(PrecisionClass::Fp32),
            _ => Behaviour::CHEAP,
        }
    }
}

/// The common float dtype and broadcast shape of `inputs` (at least one).
fn broadcast_all(inputs: &[&TensorType]) -> Result<TensorType> {
    let first = inputs[0];
    float(first, "operand")?;
    let mut shape = first.shape.clone();
    for x in &inputs[1..] {
        same_dtype(first, x)?;
        match broadcast(&shape, &x.shape) {
            Some(s) => shape = s,
            None => {
                return fail(
                    format!("shapes do not broadcast: {first} and {x}"),
                    "dims must be equal or 1, aligned from the right",
                )
            }
        }
    }
    Ok(TensorType::new(first.dtype, shape))
}
