//! Backward rules of the convolution and the transposed convolution: each is the other's
//! input gradient, and both weight gradients are the one weight-gradient op.

use crate::ir::Op;
use crate::ops::backward::{Backward, Vjp};
use crate::passes::StageError;

impl Backward for super::Family {
    fn vjp(&self, op: &Op, cx: &mut Vjp<'_>) -> Result<(), StageError> {
        let (x, dy) = (cx.x, cx.dy);
        match op {
            Op::Conv(conv) => {
                let conv = conv.clone();
                let c = conv.clone();
                cx.set(0, |rw| {
                    let input = rw.shape(x[0])[2..].to_vec();
                    rw.add(Op::ConvBackwardInput { conv: c, input }, vec![dy, x[1]])
                })?;
                cx.set(1, |rw| {
                    let kernel = rw.shape(x[1])[2..].to_vec();
                    rw.add(Op::ConvBackwardWeight { conv, kernel }, vec![x[0], dy])
                })
            }
            // y = convT(x, w) is the input gradient of conv(y, w) at x: dx = conv(dy, w),
            // and dw[c, o] pairs dy (conv's input) with x (conv's output gradient).
            Op::ConvTranspose { conv, .. } => {
                let conv = conv.clone();
                let c = conv.clone();
                cx.set(0, |rw| rw.add(Op::Conv(c), vec![dy, x[1]]))?;
                cx.set(1, |rw| {
                    let kernel = rw.shape(x[1])[2..].to_vec();
                    rw.add(Op::ConvBackwardWeight { conv, kernel }, vec![dy, x[0]])
                })
            }
            Op::ConvBackwardInput { .. } | Op::ConvBackwardWeight { .. } => Err(cx.not_forward(op)),
            _ => Err(cx.foreign(op, "conv")),
        }
    }
}
