//! Backward rules of the reductions and broadcasts: each one's gradient is its dual.

use crate::ir::Op;
use crate::ops::backward::{Backward, Vjp};
use crate::passes::StageError;

impl Backward for super::Family {
    fn vjp(&self, op: &Op, cx: &mut Vjp<'_>) -> Result<(), StageError> {
        let (x, y, dy) = (cx.x, cx.y, cx.dy);
        match op {
            Op::SumTo { .. } => cx.set(0, |rw| {
                let shape = rw.shape(x[0]);
                rw.add(Op::BroadcastTo { shape }, vec![dy])
            }),
            Op::BroadcastTo { .. } => cx.set(0, |rw| rw.sum_to(dy, x[0])),
            Op::MaxTo { .. } => cx.set(0, |rw| rw.add(Op::MaxToBackward, vec![x[0], y, dy])),
            Op::MaxToBackward => Err(cx.not_forward(op)),
            _ => Err(cx.foreign(op, "reduce")),
        }
    }
}
