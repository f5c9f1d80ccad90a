//! Backward rule of the cast op: the gradient is cast back to the input's dtype. A cast
//! group has none: `passes::cast_groups` makes it after autodiff.

use crate::ir::Op;
use crate::ops::backward::{Backward, Vjp};
use crate::passes::StageError;

impl Backward for super::Family {
    fn vjp(&self, op: &Op, cx: &mut Vjp<'_>) -> Result<(), StageError> {
        let (x, dy) = (cx.x, cx.dy);
        match op {
            Op::Cast { .. } => cx.set(0, |rw| rw.add(Op::Cast { to: rw.dtype(x[0]) }, vec![dy])),
            // Made after autodiff, from casts already differentiated.
            Op::CastGroup { .. } => Err(cx.not_forward(op)),
            _ => Err(cx.foreign(op, "cast")),
        }
    }
}
