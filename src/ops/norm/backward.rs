//! Backward rule of the normalizations: one op each for the input, weight and bias gradient
//! (a layer norm's bias gradient is a `sum_to`).
//! The running-statistics update has none.

use crate::ir::{NormKind, Op};
use crate::ops::backward::{Backward, Vjp};
use crate::passes::StageError;

impl Backward for super::Family {
    fn vjp(&self, op: &Op, cx: &mut Vjp<'_>) -> Result<(), StageError> {
        let (x, dy) = (cx.x, cx.dy);
        match op {
            Op::Norm { kind, eps, store } => {
                let (kind, eps) = (*kind, *eps);
                // A norm stored narrow takes its gradient back in the input's precision, as
                // the cast it replaced did (a matmul writing it folds that cast in turn).
                let dy = match store {
                    Some(_) => {
                        let to = cx.rw().dtype(x[0]);
                        cx.rw().add(Op::Cast { to }, vec![dy])?
                    }
                    None => dy,
                };
                cx.set(0, |rw| {
                    rw.add(Op::NormBackwardInput { kind, eps }, vec![x[0], x[1], dy])
                })?;
                cx.set(1, |rw| {
                    rw.add(Op::NormBackwardWeight { kind, eps }, vec![x[0], dy])
                })?;
                // A layer norm's bias gradient sums dy over every row: a `sum_to` to the
                // bias (one launch over the channels); per-channel norms keep their own op.
                match (kind, x.get(2)) {
                    (NormKind::Layer, Some(&bias)) => cx.set(2, |rw| rw.sum_to(dy, bias)),
                    _ => cx.set(2, |rw| rw.add(Op::NormBackwardBias { kind }, vec![dy])),
                }
            }
            // The running-statistics update feeds no value: no gradient flows through it.
            Op::NormBackwardInput { .. }
            | Op::AddNorm { .. }
            | Op::NormBackwardWeight { .. }
            | Op::NormBackwardBias { .. }
            | Op::NormBackward { .. }
            | Op::BatchNormStats { .. } => Err(cx.not_forward(op)),
            _ => Err(cx.foreign(op, "norm")),
        }
    }
}
