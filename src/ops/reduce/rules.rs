//! Shape and dtype rule, cost and precision class of the reductions and broadcasts between
//! a shape and its broadcast. Integer tensors are neither reduced nor broadcast.

use crate::ir::{broadcast, Op, ShapeDisplay, TensorType};
use crate::ops::rules::{
    arity, elementwise_flops, fail, float, foreign, same_shape, Behaviour, PrecisionClass, Result,
    Rules,
};

/// Fails unless `x` is floating: the reductions and broadcasts take no integer tensors.
fn reducible(op: &Op, x: &TensorType) -> Result<()> {
    float(x, &format!("the input of `{}`", op.name()))
}

/// The type of `x` max-reduced to `shape` (same rank, reduced dims 1).
fn max_to(op: &Op, x: &TensorType, shape: &[usize]) -> Result<TensorType> {
    let ok =
        shape.len() == x.shape.len() && shape.iter().zip(&x.shape).all(|(&s, &d)| s == d || s == 1);
    if !ok {
        return fail(
            format!("cannot max-reduce {x} to {}", ShapeDisplay(shape)),
            "keep the rank; reduced dims become 1",
        );
    }
    reducible(op, x)?;
    Ok(TensorType::new(x.dtype, shape.to_vec()))
}

impl Rules for super::Family {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
        match op {
            Op::SumTo { shape } => {
                arity(op, inputs, 1, 1)?;
                let x = inputs[0];
                match broadcast(shape, &x.shape) {
                    Some(b) if b == x.shape => {}
                    _ => {
                        return fail(
                            format!("cannot reduce {x} to {}", ShapeDisplay(shape)),
                            "the target must broadcast to the input",
                        )
                    }
                }
                reducible(op, x)?;
                Ok(TensorType::new(x.dtype, shape.clone()))
            }
            Op::BroadcastTo { shape } => {
                arity(op, inputs, 1, 1)?;
                let x = inputs[0];
                match broadcast(&x.shape, shape) {
                    Some(b) if &b == shape => {}
                    _ => {
                        return fail(
                            format!("cannot broadcast {x} to {}", ShapeDisplay(shape)),
                            "dims must be equal or 1, aligned from the right",
                        )
                    }
                }
                reducible(op, x)?;
                Ok(TensorType::new(x.dtype, shape.clone()))
            }
            Op::MaxTo { shape } => {
                arity(op, inputs, 1, 1)?;
                max_to(op, inputs[0], shape)
            }
            Op::MaxToBackward => {
                arity(op, inputs, 3, 3)?;
                let (x, y, dy) = (inputs[0], inputs[1], inputs[2]);
                same_shape(y, dy, op.name())?;
                max_to(op, x, &y.shape)?;
                Ok(x.clone())
            }
            _ => foreign(op, "reduce"),
        }
    }

    fn flops(&self, _op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
        elementwise_flops(inputs, out)
    }

    fn behaviour(&self, op: &Op) -> Behaviour {
        match op {
            Op::SumTo { .. } | Op::MaxTo { .. } => {
                Behaviour::CHEAP.in_precision(PrecisionClass::Fp32)
            }
            _ => Behaviour::CHEAP,
        }
    }
}
