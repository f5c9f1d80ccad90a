//! Backward rule of dropout: the same mask (same `p` and seed) applied to `dy`.

use crate::ir::Op;
use crate::ops::backward::{Backward, Vjp};
use crate::passes::StageError;

impl Backward for super::Family {
    fn vjp(&self, op: &Op, cx: &mut Vjp<'_>) -> Result<(), StageError> {
        let dy = cx.dy;
        match op {
            Op::Dropout { p, seed } => {
                cx.set(0, |rw| rw.add(Op::Dropout { p: *p, seed: *seed }, vec![dy]))
            }
            _ => Err(cx.foreign(op, "random")),
        }
    }
}
