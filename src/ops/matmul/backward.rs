//! Backward rule of the matrix product: each operand's gradient is a product of `dy` with the
//! other operand, summed back over broadcast batch axes; a rank-2 weight used by a batched
//! product gets its gradient from one flattened 2-D product.

use crate::ir::{Op, ValueId};
use crate::ops::backward::{Backward, Vjp};
use crate::passes::autodiff::Rewriter;
use crate::passes::StageError;

impl Backward for super::Family {
    fn vjp(&self, op: &Op, cx: &mut Vjp<'_>) -> Result<(), StageError> {
        let Op::MatMul { ta, tb, .. } = *op else {
            return Err(match op {
                Op::MatMulBiasGrad { .. } => cx.not_forward(op),
                _ => cx.foreign(op, "matmul"),
            });
        };
        let (a, b, dy) = (cx.x[0], cx.x[1], cx.dy);
        cx.set(0, |rw| {
            let g = if ta {
                rw.add(Op::matmul(tb, true), vec![b, dy])?
            } else {
                rw.add(Op::matmul(false, !tb), vec![dy, b])?
            };
            rw.sum_to(g, a)
        })?;
        cx.set(1, |rw| {
            let flat = rw.shape(b).len() == 2 && rw.shape(a).len() > 2;
            let at = Op::matmul(true, false);
            let g = match (tb, flat && !ta) {
                (false, true) => flat_matmul(rw, at, a, dy)?,
                (true, true) => flat_matmul(rw, at, dy, a)?,
                (false, false) => rw.add(Op::matmul(!ta, false), vec![a, dy])?,
                (true, false) => rw.add(Op::matmul(true, ta), vec![dy, a])?,
            };
            rw.sum_to(g, b)
        })
    }
}

/// `op` applied to `a` and `b` each reshaped to rank 2 (leading axes folded into rows; no
/// node for an operand already of rank 2).
fn flat_matmul(rw: &mut Rewriter, op: Op, a: ValueId, b: ValueId) -> Result<ValueId, StageError> {
    let flat = |rw: &mut Rewriter, v: ValueId| -> Result<ValueId, StageError> {
        let s = rw.shape(v);
        if s.len() == 2 {
            return Ok(v);
        }
        let last = s[s.len() - 1];
        let rows = s[..s.len() - 1].iter().product();
        rw.add(
            Op::Reshape {
                shape: vec![rows, last],
            },
            vec![v],
        )
    };
    let a = flat(rw, a)?;
    let b = flat(rw, b)?;
    rw.add(op, vec![a, b])
}
