//! Shape and dtype rule, cost and precision class of max and average pooling and their
//! backward ops.

use super::PoolParams;
use crate::ir::{Op, TensorType};
use crate::ops::rules::{
    arity, elementwise_flops, fail, float, foreign, rank_exactly, window_out, Behaviour, Result,
    Rules,
};

/// The output of pooling `x[N, C, H, W]`.
fn pool_out(x: &TensorType, p: &PoolParams) -> Result<TensorType> {
    rank_exactly(x, 4, "pooling input")?;
    let ho = window_out(x.shape[2], p.kernel[0], p.stride[0], p.padding[0], 1);
    let wo = window_out(x.shape[3], p.kernel[1], p.stride[1], p.padding[1], 1);
    if p.padding[0] * 2 > p.kernel[0] || p.padding[1] * 2 > p.kernel[1] {
        return fail(
            format!(
                "pool padding {:?} is more than half the kernel {:?}",
                p.padding, p.kernel
            ),
            "padding must be at most kernel / 2",
        );
    }
    match (ho, wo) {
        (Some(ho), Some(wo)) => Ok(TensorType::new(
            x.dtype,
            vec![x.shape[0], x.shape[1], ho, wo],
        )),
        _ => fail(
            format!("pool window {:?} does not fit input {x}", p.kernel),
            "use a smaller kernel or add padding",
        ),
    }
}

/// A pooling gradient `dy` must be rank 4 with the shape pooling `x` produces.
fn pool_grad_check(dy: &TensorType, x: &TensorType, p: &PoolParams) -> Result<()> {
    rank_exactly(dy, 4, "pooling gradient")?;
    let y = pool_out(x, p)?;
    if y.shape != dy.shape {
        return fail(
            format!("pooling gradient {dy} does not match the forward output {y}"),
            "the gradient must have the shape of the pooling's output",
        );
    }
    Ok(())
}

impl Rules for super::Family {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
        match op {
            Op::MaxPool2d(p) | Op::AvgPool2d(p) => {
                arity(op, inputs, 1, 1)?;
                float(inputs[0], "pooling input")?;
                pool_out(inputs[0], p)
            }
            Op::MaxPool2dBackward(p) => {
                arity(op, inputs, 2, 2)?;
                let (x, dy) = (inputs[0], inputs[1]);
                pool_grad_check(dy, x, p)?;
                Ok(x.clone())
            }
            Op::AvgPool2dBackward { pool, input } => {
                arity(op, inputs, 1, 1)?;
                let dy = inputs[0];
                rank_exactly(dy, 4, "pooling gradient")?;
                let dx =
                    TensorType::new(dy.dtype, vec![dy.shape[0], dy.shape[1], input[0], input[1]]);
                pool_grad_check(dy, &dx, pool)?;
                Ok(dx)
            }
            _ => foreign(op, "pool"),
        }
    }

    fn flops(&self, _op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
        elementwise_flops(inputs, out)
    }

    fn behaviour(&self, _op: &Op) -> Behaviour {
        Behaviour::CHEAP
    }
}
