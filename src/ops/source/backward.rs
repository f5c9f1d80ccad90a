//! Backward rules of the source ops: they have no inputs, so no gradients.

use crate::ir::Op;
use crate::ops::backward::{Backward, Vjp};
use crate::passes::StageError;

impl Backward for super::Family {
    fn vjp(&self, op: &Op, cx: &mut Vjp<'_>) -> Result<(), StageError> {
        match op {
            Op::Input { .. } | Op::Param { .. } | Op::OptimState { .. } | Op::Fill { .. } => Ok(()),
            _ => Err(cx.foreign(op, "source")),
        }
    }
}
