//! Backward rules of the losses: cross-entropy with respect to the logits, mean squared error
//! with respect to both operands (the target's gradient is the negated prediction's), the
//! fused linear cross-entropy with respect to its hidden states and its weight (two ops, each
//! recomputing the logits chunk by chunk, reading the per-row losses for their log-sum-exp).
//! With an ignored id the cross-entropy's backward reads the forward's count of kept rows;
//! the count itself, of integer targets, has no gradient.

use crate::ir::{LceGrad, Op, UnaryFn};
use crate::ops::backward::{Backward, Vjp};
use crate::passes::StageError;

impl Backward for super::Family {
    fn vjp(&self, op: &Op, cx: &mut Vjp<'_>) -> Result<(), StageError> {
        let (x, dy) = (cx.x, cx.dy);
        match op {
            Op::CrossEntropy(ce) => {
                let mut inputs = vec![x[0], x[1], dy];
                inputs.extend(x.get(2).copied());
                cx.set(0, |rw| rw.add(Op::CrossEntropyBackward(*ce), inputs))
            }
            Op::KeptCount(_) => Ok(()),
            Op::LinearCrossEntropy(lce) => {
                let inputs = vec![x[0], x[1], x[2], cx.y, dy];
                for (i, which) in [(0, LceGrad::Input), (1, LceGrad::Weight)] {
                    let op = Op::LinearCrossEntropyBackward { lce: *lce, which };
                    cx.set(i, |rw| rw.add(op, inputs.clone()))?;
                }
                Ok(())
            }
            Op::Mse => {
                let da = cx.rw().add(Op::MseBackward, vec![x[0], x[1], dy])?;
                cx.set(1, |rw| rw.add(Op::Unary(UnaryFn::Neg), vec![da]))?;
                cx.set(0, |_| Ok(da))
            }
            Op::CrossEntropyBackward(_)
            | Op::LinearCrossEntropyBackward { .. }
            | Op::MseBackward => Err(cx.not_forward(op)),
            _ => Err(cx.foreign(op, "loss")),
        }
    }
}
