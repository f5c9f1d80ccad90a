//! Shape and dtype rule, cost and precision class of the reductions and broadcasts between
//! a shape and its broadcast. Integer tensors are neither reduced nor broadcast.

use crate::ir::{broadcast, DType, Op, ShapeDisplay, TensorType};
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

/// The type of the only input reduced (`reduce`) or broadcast to `shape`, which must
/// broadcast to the input, or the input to it.
fn between_broadcasts(
    op: &Op,
    inputs: &[&TensorType],
    shape: &[usize],
    reduce: bool,
) -> Result<TensorType> {
    arity(op, inputs, 1, 1)?;
    let x = inputs[0];
    let (from, to, verb, help) = if reduce {
        (
            shape,
            &x.shape[..],
            "reduce",
            "the target must broadcast to the input",
        )
    } else {
        (
            &x.shape[..],
            shape,
            "broadcast",
            "dims must be equal or 1, aligned from the right",
        )
    };
    if broadcast(from, to).as_deref() != Some(to) {
        return fail(
            format!("cannot {verb} {x} to {}", ShapeDisplay(shape)),
            help,
        );
    }
    reducible(op, x)?;
    Ok(TensorType::new(x.dtype, shape.to_vec()))
}

impl Rules for super::Family {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
        match op {
            Op::SumTo { shape, f32_out } => {
                let sum = between_broadcasts(op, inputs, shape, true)?;
                Ok(if *f32_out {
                    sum.with_dtype(DType::F32)
                } else {
                    sum
                })
            }
            Op::BroadcastTo { shape } => between_broadcasts(op, inputs, shape, false),
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
