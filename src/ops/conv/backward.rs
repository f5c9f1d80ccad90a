//! Backward rule of the 2-D convolution: one op for the input gradient, one for the weight's.

use crate::ir::Op;
use crate::ops::backward::{Backward, Vjp};
use crate::passes::StageError;

impl Backward for super::Family {
    fn vjp(&self, op: &Op, cx: &mut Vjp<'_>) -> Result<(), StageError> {
        let (x, dy) = (cx.x, cx.dy);
        match op {
            Op::Conv2d(conv) => {
                let conv = *conv;
                cx.set(0, |rw| {
                    let xs = rw.shape(x[0]);
                    let input = [xs[2], xs[3]];
                    rw.add(Op::Conv2dBackwardInput { conv, input }, vec![dy, x[1]])
                })?;
                cx.set(1, |rw| {
                    let ws = rw.shape(x[1]);
                    let kernel = [ws[2], ws[3]];
                    rw.add(Op::Conv2dBackwardWeight { conv, kernel }, vec![x[0], dy])
                })
            }
            Op::Conv2dBackwardInput { .. } | Op::Conv2dBackwardWeight { .. } => {
                Err(cx.not_forward(op))
            }
            _ => Err(cx.foreign(op, "conv")),
        }
    }
}
