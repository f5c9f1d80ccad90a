//! Shape and dtype rule, cost and precision class of the pointwise ops.

use crate::ir::{broadcast, Op, TensorType, UnaryFn};
use crate::ops::rules::{
    arity, elementwise_flops, fail, float, foreign, same_dtype, same_shape, Behaviour,
    PrecisionClass, Result, Rules,
};

impl Rules for super::Family {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
        match op {
            Op::Unary(_) | Op::Affine { .. } => {
                arity(op, inputs, 1, 1)?;
                float(inputs[0], "operand")?;
                Ok(inputs[0].clone())
            }
            Op::UnaryBackward(_) | Op::UnaryOutputBackward(_) => {
                arity(op, inputs, 2, 2)?;
                same_shape(inputs[0], inputs[1], op.name())?;
                float(inputs[0], "operand")?;
                Ok(inputs[0].clone())
            }
            Op::Binary(_) => {
                arity(op, inputs, 2, 2)?;
                let (a, b) = (inputs[0], inputs[1]);
                float(a, "operand")?;
                same_dtype(a, b)?;
                match broadcast(&a.shape, &b.shape) {
                    Some(shape) => Ok(TensorType::new(a.dtype, shape)),
                    None => fail(
                        format!("shapes do not broadcast: {a} and {b}"),
                        "dims must be equal or 1, aligned from the right",
                    ),
                }
            }
            _ => foreign(op, "pointwise"),
        }
    }

    fn flops(&self, op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
        match op {
            Op::Unary(_) | Op::UnaryBackward(_) | Op::UnaryOutputBackward(_) => 4 * out.numel(),
            _ => elementwise_flops(inputs, out),
        }
    }

    fn behaviour(&self, op: &Op) -> Behaviour {
        match op {
            // autocast's fp32 list (softplus among them, as torch.autocast runs it).
            Op::Unary(
                UnaryFn::Exp | UnaryFn::Log | UnaryFn::Sqrt | UnaryFn::Rsqrt | UnaryFn::Softplus,
            ) => Behaviour::CHEAP.in_precision(PrecisionClass::Fp32),
            _ => Behaviour::CHEAP,
        }
    }
}
