//! Backward rule of the normalizations: one op each for the input, weight and bias gradient.
//! The running-statistics update has none.

use crate::ir::Op;
use crate::ops::backward::{Backward, Vjp};
use crate::passes::StageError;

impl Backward for super::Family {
    fn vjp(&self, op: &Op, cx: &mut Vjp<'_>) -> Result<(), StageError> {
        let (x, dy) = (cx.x, cx.dy);
        match op {
            Op::Norm { kind, eps } => {
                let (kind, eps) = (*kind, *eps);
                cx.set(0, |rw| {
                    rw.add(Op::NormBackwardInput { kind, eps }, vec![x[0], x[1], dy])
                })?;
                cx.set(1, |rw| {
                    rw.add(Op::NormBackwardWeight { kind, eps }, vec![x[0], dy])
                })?;
                cx.set(2, |rw| rw.add(Op::NormBackwardBias { kind }, vec![dy]))
            }
            // The running-statistics update feeds no value: no gradient flows through it.
            Op::NormBackwardInput { .. }
            | Op::NormBackwardWeight { .. }
            | Op::NormBackwardBias { .. }
            | Op::BatchNormStats { .. } => Err(cx.not_forward(op)),
            _ => Err(cx.foreign(op, "norm")),
        }
    }
}
