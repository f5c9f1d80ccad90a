//! Backward rules of the copies between tiers: there are none, as they are made after
//! autodiff (the optimizer's in the update, the activations' around the backward).

use crate::ir::Op;
use crate::ops::backward::{Backward, Vjp};
use crate::passes::StageError;

impl Backward for super::Family {
    fn vjp(&self, op: &Op, cx: &mut Vjp<'_>) -> Result<(), StageError> {
        match op {
            Op::CopyToHost | Op::CopyToDevice | Op::CopyFromHost => Err(cx.not_forward(op)),
            _ => Err(cx.foreign(op, "transfer")),
        }
    }
}
