//! Built-in elementwise selections: `minimum`, `maximum`, the comparisons (`less`,
//! `less_equal`, `greater`, `greater_equal`, `equal`: 0/1 masks in the operands' dtype),
//! `where` and `clamp`. An operand may be a number where another is a tensor: it becomes a
//! scalar of that tensor's dtype.

use super::Args;
use crate::diagnostic::UserError;
use crate::front::lower::{Lowerer, R};
use crate::front::value::{Spanned, Val};
use crate::ir::*;

/// The binary function a selection built-in name calls.
pub(super) fn binary_fn(name: &str) -> Option<BinaryFn> {
    match name {
        "minimum" => Some(BinaryFn::Minimum),
        "maximum" => Some(BinaryFn::Maximum),
        "pow" => Some(BinaryFn::Pow),
        _ => BinaryFn::COMPARISONS
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(f, _)| *f),
    }
}

impl Lowerer<'_> {
    /// `minimum(a, b)`, `maximum(a, b)`, `pow(a, b)` or a comparison, broadcasting.
    pub(super) fn selection(&mut self, f: BinaryFn, args: &mut Args, span: Span) -> R<Val> {
        let a = args.positional("first")?;
        let b = args.positional("second")?;
        let ids = self.operands(&args.func, &[a, b], span)?;
        self.op(Op::Binary(f), ids, span)
    }

    /// `where(cond, a, b)`: `a` where `cond` is nonzero, else `b`, broadcasting.
    pub(super) fn where_call(&mut self, args: &mut Args, span: Span) -> R<Val> {
        let c = args.positional("condition")?;
        let a = args.positional("second")?;
        let b = args.positional("third")?;
        let ids = self.operands(&args.func, &[c, a, b], span)?;
        self.op(Op::Where, ids, span)
    }

    /// `clamp(x, lo, hi)` (or `lo = `, `hi = `; at least one): numbers clamp in one op; a
    /// tensor bound is `where(x < lo, lo, x)` then `where(t > hi, hi, t)`, so `hi` wins
    /// when `lo > hi` and, as in `torch.clamp`, `x` keeps the gradient at a bound.
    pub(super) fn clamp(&mut self, args: &mut Args, span: Span) -> R<Val> {
        let x = self.t(args, "input")?;
        let bound = |name: &str, args: &mut Args| match args.optional(name) {
            Some(v) => Some(v),
            None => (args.pos.len() > args.used_pos)
                .then(|| args.positional(name).ok())
                .flatten(),
        };
        let lo = bound("lo", args);
        let hi = bound("hi", args);
        if lo.is_none() && hi.is_none() {
            return Err(UserError::at(
                span,
                "`clamp` needs a lower or an upper bound",
                "no bounds",
                "write `clamp(x, lo, hi)`, `clamp(x, lo = 0)` or `clamp(x, hi = 6)`",
            ));
        }
        let number = |b: &Option<Spanned>| {
            !matches!(
                b,
                Some(Spanned {
                    val: Val::Tensor(_),
                    ..
                })
            )
        };
        if number(&lo) && number(&hi) {
            let value = |b: Option<Spanned>| -> R<Option<f32>> {
                b.map(|b| self.float(&b, "a bound of `clamp`").map(|v| v as f32))
                    .transpose()
            };
            let bounds = Bounds {
                lo: value(lo)?,
                hi: value(hi)?,
            };
            return self.op(Op::Clamp(bounds), vec![x], span);
        }
        let mut y = x;
        for (bound, upper) in [(lo, false), (hi, true)] {
            let Some(b) = bound else { continue };
            y = match b.val {
                Val::Tensor(t) => {
                    let test = if upper {
                        BinaryFn::Greater
                    } else {
                        BinaryFn::Less
                    };
                    let mask = self.add(Op::Binary(test), vec![y, t], span)?;
                    self.add(Op::Where, vec![mask, t, y], span)?
                }
                _ => {
                    let v = Some(self.float(&b, "a bound of `clamp`")? as f32);
                    let bounds = if upper {
                        Bounds { lo: None, hi: v }
                    } else {
                        Bounds { lo: v, hi: None }
                    };
                    self.add(Op::Clamp(bounds), vec![y], span)?
                }
            };
        }
        Ok(Val::Tensor(y))
    }

    /// The operands of `func` as tensors: numbers become scalars of the first tensor's
    /// dtype; at least one must be a tensor.
    fn operands(&mut self, func: &str, vals: &[Spanned], span: Span) -> R<Vec<ValueId>> {
        let Some(dtype) = vals.iter().find_map(|v| match v.val {
            Val::Tensor(t) => Some(self.ty(t).dtype),
            _ => None,
        }) else {
            return Err(UserError::at(
                span,
                format!("`{func}` needs at least one tensor operand"),
                "only numbers",
                "compute with numbers directly, or pass a tensor",
            ));
        };
        vals.iter()
            .map(|v| match v.val {
                Val::Tensor(t) => Ok(t),
                _ => {
                    let value = self.float(v, &format!("an operand of `{func}`"))? as f32;
                    let ty = TensorType::new(dtype, vec![]);
                    self.add(Op::Fill { value, ty }, vec![], v.span)
                }
            })
            .collect()
    }
}
