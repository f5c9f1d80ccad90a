//! Backward rules of the 2-D poolings: max pooling routes `dy` to each window's maximum,
//! average pooling spreads it over the window.

use crate::ir::Op;
use crate::ops::backward::{Backward, Vjp};
use crate::passes::StageError;

impl Backward for super::Family {
    fn vjp(&self, op: &Op, cx: &mut Vjp<'_>) -> Result<(), StageError> {
        let (x, dy) = (cx.x, cx.dy);
        match op {
            Op::MaxPool2d(p) => cx.set(0, |rw| rw.add(Op::MaxPool2dBackward(*p), vec![x[0], dy])),
            Op::AvgPool2d(pool) => cx.set(0, |rw| {
                let xs = rw.shape(x[0]);
                let input = [xs[2], xs[3]];
                rw.add(Op::AvgPool2dBackward { pool: *pool, input }, vec![dy])
            }),
            Op::MaxPool2dBackward(_) | Op::AvgPool2dBackward { .. } => Err(cx.not_forward(op)),
            _ => Err(cx.foreign(op, "pool")),
        }
    }
}
