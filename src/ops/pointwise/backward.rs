//! Backward rules (vector-Jacobian products as graph ops) of the pointwise ops: broadcast
//! operands get their gradient summed back to their own shape.

use crate::ir::{BinaryFn, DType, Op, TensorType, UnaryFn, ValueId};
use crate::ops::backward::{Backward, Vjp};
use crate::passes::autodiff::Rewriter;
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
            Op::Binary(f) if f.is_comparison() => Ok(()),
            Op::Binary(f @ (BinaryFn::Minimum | BinaryFn::Maximum)) => extremum(cx, *f),
            Op::Binary(BinaryFn::Pow) => power(cx),
            Op::Binary(f) => binary(cx, *f),
            Op::Where => select(cx),
            Op::Clamp(bounds) => cx.set(0, |rw| rw.add(Op::ClampBackward(*bounds), vec![x[0], dy])),
            Op::Affine { scale, .. } => cx.set(0, |rw| {
                rw.add(
                    Op::Affine {
                        scale: *scale,
                        shift: 0.0,
                    },
                    vec![dy],
                )
            }),
            Op::UnaryBackward(_)
            | Op::UnaryOutputBackward(_)
            | Op::UnaryPair(_)
            | Op::ClampBackward(_) => Err(cx.not_forward(op)),
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
            BinaryFn::Mul | BinaryFn::Div => rw.add(Op::Binary(f), vec![dy, b])?,
            _ => dy,
        };
        let t = rw.sum_to(t, a)?;
        in_type_of(rw, t, a)
    })?;
    cx.set(1, |rw| {
        let t = match f {
            BinaryFn::Sub => rw.add(Op::Unary(UnaryFn::Neg), vec![dy])?,
            BinaryFn::Mul => rw.add(Op::Binary(BinaryFn::Mul), vec![dy, a])?,
            BinaryFn::Div => {
                let t = rw.add(Op::Binary(BinaryFn::Mul), vec![dy, y])?;
                let t = rw.add(Op::Binary(BinaryFn::Div), vec![t, b])?;
                rw.add(Op::Unary(UnaryFn::Neg), vec![t])?
            }
            _ => dy,
        };
        let t = rw.sum_to(t, b)?;
        in_type_of(rw, t, b)
    })
}

/// Gradient `g` in the dtype of its operand `like` (a 16-bit operand of a promoted fp32
/// op gets its fp32 gradient rounded, as the backward of the widening cast it replaces
/// would round it); no node when they agree.
fn in_type_of(rw: &mut Rewriter, g: ValueId, like: ValueId) -> Result<ValueId, StageError> {
    let to = rw.dtype(like);
    if rw.dtype(g) == to {
        return Ok(g);
    }
    rw.add(Op::Cast { to }, vec![g])
}

/// Gradients of `minimum(a, b)` / `maximum(a, b)`: all of `dy` to the operand chosen, half
/// to each where they tie (PyTorch's rule). With `w = [a wins] + 0.5 [a == b]`, `a` gets
/// `dy * w` and `b` gets `dy * (1 - w)`, each summed back to its shape.
fn extremum(cx: &mut Vjp<'_>, f: BinaryFn) -> Result<(), StageError> {
    let (a, b, dy) = (cx.x[0], cx.x[1], cx.dy);
    let wins = match f {
        BinaryFn::Minimum => BinaryFn::Less,
        _ => BinaryFn::Greater,
    };
    let rw = cx.rw();
    let strict = rw.add(Op::Binary(wins), vec![a, b])?;
    let tie = rw.add(Op::Binary(BinaryFn::Equal), vec![a, b])?;
    let half = rw.add(
        Op::Affine {
            scale: 0.5,
            shift: 0.0,
        },
        vec![tie],
    )?;
    let w = rw.add(Op::Binary(BinaryFn::Add), vec![strict, half])?;
    cx.set(0, |rw| {
        let t = rw.add(Op::Binary(BinaryFn::Mul), vec![dy, w])?;
        let t = rw.sum_to(t, a)?;
        in_type_of(rw, t, a)
    })?;
    cx.set(1, |rw| {
        let rest = rw.add(
            Op::Affine {
                scale: -1.0,
                shift: 1.0,
            },
            vec![w],
        )?;
        let t = rw.add(Op::Binary(BinaryFn::Mul), vec![dy, rest])?;
        rw.sum_to(t, b)
    })
}

/// Gradients of `pow(a, b)` as PyTorch defines them: `dy * b * pow(a, b - 1)` to `a`, 0
/// where `b == 0`; `dy * y * log(a)` to `b`, 0 where `a == 0` and `b >= 0`; each summed back
/// to its operand's shape.
fn power(cx: &mut Vjp<'_>) -> Result<(), StageError> {
    let (a, b, y, dy) = (cx.x[0], cx.x[1], cx.y, cx.dy);
    cx.set(0, |rw| {
        let lower = rw.add(
            Op::Affine {
                scale: 1.0,
                shift: -1.0,
            },
            vec![b],
        )?;
        let t = rw.add(Op::Binary(BinaryFn::Pow), vec![a, lower])?;
        let t = rw.add(Op::Binary(BinaryFn::Mul), vec![t, b])?;
        let t = rw.add(Op::Binary(BinaryFn::Mul), vec![dy, t])?;
        let zero = zero_like(rw, dy)?;
        let constant = rw.add(Op::Binary(BinaryFn::Equal), vec![b, zero])?;
        let t = rw.add(Op::Where, vec![constant, zero, t])?;
        let t = rw.sum_to(t, a)?;
        in_type_of(rw, t, a)
    })?;
    cx.set(1, |rw| {
        let t = rw.add(Op::Unary(UnaryFn::Log), vec![a])?;
        let t = rw.add(Op::Binary(BinaryFn::Mul), vec![y, t])?;
        let t = rw.add(Op::Binary(BinaryFn::Mul), vec![dy, t])?;
        let zero = zero_like(rw, dy)?;
        let base_zero = rw.add(Op::Binary(BinaryFn::Equal), vec![a, zero])?;
        let not_negative = rw.add(Op::Binary(BinaryFn::GreaterEqual), vec![b, zero])?;
        let flat = rw.add(Op::Binary(BinaryFn::Mul), vec![base_zero, not_negative])?;
        let t = rw.add(Op::Where, vec![flat, zero, t])?;
        rw.sum_to(t, b)
    })
}

/// Gradients of `where(cond, a, b)`: `dy` where the mask selects the operand, 0 elsewhere
/// (a `where` against a zero scalar, so a non-finite `dy` does not leak into the other
/// branch), summed back to the operand's shape; the mask gets none.
fn select(cx: &mut Vjp<'_>) -> Result<(), StageError> {
    let (c, a, b, dy) = (cx.x[0], cx.x[1], cx.x[2], cx.dy);
    cx.set(1, |rw| {
        let zero = zero_like(rw, dy)?;
        let t = rw.add(Op::Where, vec![c, dy, zero])?;
        let t = rw.sum_to(t, a)?;
        in_type_of(rw, t, a)
    })?;
    cx.set(2, |rw| {
        let zero = zero_like(rw, dy)?;
        let t = rw.add(Op::Where, vec![c, zero, dy])?;
        rw.sum_to(t, b)
    })
}

/// A scalar 0 in `v`'s dtype.
fn zero_like(rw: &mut Rewriter, v: ValueId) -> Result<ValueId, StageError> {
    let ty = TensorType::new(rw.dtype(v), vec![]);
    rw.add(Op::Fill { value: 0.0, ty }, vec![])
}
