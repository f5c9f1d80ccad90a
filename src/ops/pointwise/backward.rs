//! Backward rules (vector-Jacobian products as graph ops) of the pointwise ops: broadcast
//! operands get their gradient summed back to their own shape.

use crate::ir::{BinaryFn, DType, Op, UnaryFn};
use crate::ops::backward::{Backward, Vjp};
use crate::passes::StageError;

impl Backward for super::Family {
    fn vjp(&self, op: &Op, cx: &mut Vjp<'_>) -> Result<(), StageError> {
        let (x, y, dy) = (cx.x, cx.y, cx.dy);
        match op {
            Op::Unary(f) => cx.set(0, |rw| {
                let dx = rw.add(Op::UnaryBackward(*f), vec![x[0], dy])?;
                // From the output, the derivative is bitwise the same where `y` holds what the
                // kernel computed: always for relu (y > 0 exactly where x > 0), in fp32 for
                // the others (a rounded 16-bit `y` would change it).
                if f.derivative_from_output() && (*f == UnaryFn::Relu || rw.dtype(y) == DType::F32)
                {
                    rw.offer(dx, Op::UnaryOutputBackward(*f), vec![y, dy]);
                }
                Ok(dx)
            }),
            Op::Binary(f) => binary(cx, *f),
            Op::Affine { scale, .. } => cx.set(0, |rw| {
                rw.add(
                    Op::Affine {
                        scale: *scale,
                        shift: 0.0,
                    },
                    vec![dy],
                )
            }),
            Op::UnaryBackward(_) | Op::UnaryOutputBackward(_) => Err(cx.not_forward(op)),
            _ => Err(cx.foreign(op, "pointwise")),
        }
    }
}

/// Gradients of `a f b` with respect to `a` and `b`.
fn binary(cx: &mut Vjp<'_>, f: BinaryFn) -> Result<(), StageError> {
    let (a, b, y, dy) = (cx.x[0], cx.x[1], cx.y, cx.dy);
    // d(a f b)/da is 1 for a sum or difference, and `1 f b` for a product or quotient.
    cx.set(0, |rw| {
        let t = match f {
            BinaryFn::Add | BinaryFn::Sub => dy,
            BinaryFn::Mul | BinaryFn::Div => rw.add(Op::Binary(f), vec![dy, b])?,
        };
        rw.sum_to(t, a)
    })?;
    cx.set(1, |rw| {
        let t = match f {
            BinaryFn::Add => dy,
            BinaryFn::Sub => rw.add(Op::Unary(UnaryFn::Neg), vec![dy])?,
            BinaryFn::Mul => rw.add(Op::Binary(BinaryFn::Mul), vec![dy, a])?,
            BinaryFn::Div => {
                let t = rw.add(Op::Binary(BinaryFn::Mul), vec![dy, y])?;
                let t = rw.add(Op::Binary(BinaryFn::Div), vec![t, b])?;
                rw.add(Op::Unary(UnaryFn::Neg), vec![t])?
            }
        };
        rw.sum_to(t, b)
    })
}
