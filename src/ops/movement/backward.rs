//! Backward rules of the movement ops: each gradient is the inverse movement of `dy`.

use crate::ir::Op;
use crate::ops::backward::{Backward, Vjp};
use crate::passes::StageError;

impl Backward for super::Family {
    fn vjp(&self, op: &Op, cx: &mut Vjp<'_>) -> Result<(), StageError> {
        let (x, dy) = (cx.x, cx.dy);
        match op {
            Op::Reshape { .. } => cx.set(0, |rw| {
                let shape = rw.shape(x[0]);
                rw.add(Op::Reshape { shape }, vec![dy])
            }),
            Op::Permute { perm } => cx.set(0, |rw| {
                let mut inv = vec![0; perm.len()];
                for (i, &p) in perm.iter().enumerate() {
                    inv[p] = i;
                }
                rw.add(Op::Permute { perm: inv }, vec![dy])
            }),
            Op::Slice { axis, start, .. } => cx.set(0, |rw| {
                let full = rw.shape(x[0])[*axis];
                let (axis, start) = (*axis, *start);
                rw.add(Op::PadSlice { axis, start, full }, vec![dy])
            }),
            Op::PadSlice { axis, start, .. } => cx.set(0, |rw| {
                let len = rw.shape(x[0])[*axis];
                let (axis, start) = (*axis, *start);
                let end = start + len;
                rw.add(Op::Slice { axis, start, end }, vec![dy])
            }),
            Op::Concat { axis } => {
                let axis = *axis;
                let mut start = 0;
                for (i, &part) in x.iter().enumerate() {
                    let len = cx.rw().shape(part)[axis];
                    let end = start + len;
                    cx.set(i, |rw| rw.add(Op::Slice { axis, start, end }, vec![dy]))?;
                    start = end;
                }
                Ok(())
            }
            // Made after autodiff, reading a cast group.
            Op::Member { .. } => Err(cx.not_forward(op)),
            _ => Err(cx.foreign(op, "movement")),
        }
    }
}
