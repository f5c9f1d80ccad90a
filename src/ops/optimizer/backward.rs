//! Backward rules of the optimizer ops: there are none, as they run after the backward pass.

use crate::ir::Op;
use crate::ops::backward::{Backward, Vjp};
use crate::passes::StageError;

impl Backward for super::Family {
    fn vjp(&self, op: &Op, cx: &mut Vjp<'_>) -> Result<(), StageError> {
        match op {
            Op::ClipCoefficient { .. }
            | Op::UnscaleGrads
            | Op::LossScaleUpdate { .. }
            | Op::AccumulateGrad { .. }
            | Op::AdamW(_)
            | Op::Sgd(_) => Err(cx.not_forward(op)),
            _ => Err(cx.foreign(op, "optimizer")),
        }
    }
}
