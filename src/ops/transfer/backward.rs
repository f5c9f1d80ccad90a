//! Backward rules of the copies between tiers: there are none, as they run in the update.

use crate::ir::Op;
use crate::ops::backward::{Backward, Vjp};
use crate::passes::StageError;

impl Backward for super::Family {
    fn vjp(&self, op: &Op, cx: &mut Vjp<'_>) -> Result<(), StageError> {
        match op {
            Op::CopyToHost | Op::CopyToDevice => Err(cx.not_forward(op)),
            _ => Err(cx.foreign(op, "transfer")),
        }
    }
}
