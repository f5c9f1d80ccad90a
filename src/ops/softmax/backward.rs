//! Backward rules of softmax and log-softmax, computed from their output.

use crate::ir::Op;
use crate::ops::backward::{Backward, Vjp};
use crate::passes::StageError;

impl Backward for super::Family {
    fn vjp(&self, op: &Op, cx: &mut Vjp<'_>) -> Result<(), StageError> {
        let (y, dy) = (cx.y, cx.dy);
        match op {
            Op::Softmax { axis } => cx.set(0, |rw| {
                rw.add(Op::SoftmaxBackward { axis: *axis }, vec![y, dy])
            }),
            Op::LogSoftmax { axis } => cx.set(0, |rw| {
                rw.add(Op::LogSoftmaxBackward { axis: *axis }, vec![y, dy])
            }),
            Op::SoftmaxBackward { .. } | Op::LogSoftmaxBackward { .. } => Err(cx.not_forward(op)),
            _ => Err(cx.foreign(op, "softmax")),
        }
    }
}
