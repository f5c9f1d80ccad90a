//! Built-in reductions, softmax and the functions that only move data: reshaping,
//! transposing, concatenating, splitting and slicing.

use super::{axis, boolean, Args};
use crate::diagnostic::UserError;
use crate::front::lower::{Lowerer, R};
use crate::front::value::{Spanned, Val};
use crate::ir::*;

/// The axes of a reduction, sorted and deduplicated; all of them when `v` is absent.
fn axes_of(l: &Lowerer, v: Option<Spanned>, rank: usize) -> R<Vec<usize>> {
    let Some(v) = v else {
        return Ok((0..rank).collect());
    };
    let items = match &v.val {
        Val::Tuple(items) => items.clone(),
        other => vec![other.clone()],
    };
    let mut axes = Vec::new();
    for item in items {
        let s = Spanned {
            val: item,
            span: v.span,
        };
        axes.push(axis(l, &s, rank)?);
    }
    axes.sort();
    axes.dedup();
    Ok(axes)
}

/// A permutation: a tuple of axes, in order.
fn axes_in_order(l: &Lowerer, v: &Spanned, rank: usize) -> R<Vec<usize>> {
    let Val::Tuple(items) = &v.val else {
        return Err(UserError::at(
            v.span,
            "a permutation is a tuple of axes",
            "not a tuple",
            "write e.g. `(0, 2, 1, 3)`",
        ));
    };
    items
        .iter()
        .map(|i| {
            axis(
                l,
                &Spanned {
                    val: i.clone(),
                    span: v.span,
                },
                rank,
            )
        })
        .collect()
}

impl Lowerer<'_> {
    /// `sum`, `mean` or `max` over `axis` (all axes by default), dropping them unless
    /// `keepdim = true`.
    pub(super) fn reduce(&mut self, name: &str, args: &mut Args, span: Span) -> R<Val> {
        let x = self.t(args, "input")?;
        let shape = self.ty(x).shape.clone();
        let axes = axes_of(self, args.optional("axis"), shape.len())?;
        let keepdim = boolean(args.optional("keepdim"), false)?;
        let kept: Vec<usize> = shape
            .iter()
            .enumerate()
            .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
            .collect();
        let dropped: Vec<usize> = shape
            .iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(i))
            .map(|(_, &d)| d)
            .collect();
        let count: u64 = axes
            .iter()
            .fold(1u64, |acc, &a| acc.saturating_mul(shape[a] as u64));
        let total = if name == "max" {
            Op::MaxTo {
                shape: kept.clone(),
            }
        } else {
            Op::sum_to(kept.clone())
        };
        let mut y = self.add(total, vec![x], span)?;
        if name == "mean" {
            y = self.add(
                Op::Affine {
                    scale: 1.0 / count.max(1) as f32,
                    shift: 0.0,
                },
                vec![y],
                span,
            )?;
        }
        if !keepdim && dropped != kept {
            y = self.add(Op::Reshape { shape: dropped }, vec![y], span)?;
        }
        Ok(Val::Tensor(y))
    }

    /// `softmax` or `log_softmax` over `axis` (the last by default).
    pub(super) fn softmax(&mut self, name: &str, args: &mut Args, span: Span) -> R<Val> {
        let x = self.t(args, "input")?;
        let rank = self.ty(x).shape.len();
        let a = self.axis_or(args, rank, rank.saturating_sub(1))?;
        let op = if name == "softmax" {
            Op::Softmax { axis: a }
        } else {
            Op::LogSoftmax { axis: a }
        };
        self.op(op, vec![x], span)
    }

    /// `reshape(x, shape)`, where one dim of the shape may be -1.
    pub(super) fn reshape(&mut self, args: &mut Args, span: Span) -> R<Val> {
        let x = self.t(args, "input")?;
        let sv = args.positional("shape")?;
        let shape = self.shape_with_infer(&sv, self.ty(x).numel())?;
        self.op(Op::Reshape { shape }, vec![x], span)
    }

    /// `expand(x, shape)`: `x` broadcast to `shape` (its dims 1 or equal, aligned at the
    /// right), as PyTorch's `expand`; the gradient sums over the broadcast dims.
    pub(super) fn expand(&mut self, args: &mut Args, span: Span) -> R<Val> {
        let x = self.t(args, "input")?;
        let sv = args.positional("shape")?;
        let shape = self.shape_with_infer(&sv, 1)?;
        if shape.len() < self.ty(x).shape.len() {
            return Err(UserError::at(
                sv.span,
                format!("cannot expand {} to fewer dims", self.ty(x)),
                "too few dims",
                "give every dim of the result, e.g. `expand(cls, (B, 1, D))`",
            ));
        }
        self.op(Op::BroadcastTo { shape }, vec![x], span)
    }

    /// `flatten(x, start = 1)`: the axes from `start` on become one.
    pub(super) fn flatten(&mut self, args: &mut Args, span: Span) -> R<Val> {
        let x = self.t(args, "input")?;
        let shape = self.ty(x).shape.clone();
        let start = match args.optional("start") {
            Some(v) => axis(self, &v, shape.len())?,
            None => 1.min(shape.len()),
        };
        let mut out = shape[..start].to_vec();
        out.push(shape[start..].iter().product());
        self.op(Op::Reshape { shape: out }, vec![x], span)
    }

    /// `transpose(x, a, b)` (the last two axes by default) or `permute(x, perm)`.
    pub(super) fn transpose(&mut self, name: &str, args: &mut Args, span: Span) -> R<Val> {
        let x = self.t(args, "input")?;
        let rank = self.ty(x).shape.len();
        let perm = if name == "permute" {
            let pv = args.positional("permutation")?;
            axes_in_order(self, &pv, rank)?
        } else {
            let mut perm: Vec<usize> = (0..rank).collect();
            let nth = |i: usize, default: usize| -> R<usize> {
                match args.pos.get(i) {
                    Some(v) => axis(self, v, rank),
                    None => Ok(default),
                }
            };
            let a = nth(1, rank.saturating_sub(2))?;
            let b = nth(2, rank.saturating_sub(1))?;
            args.rest();
            if rank < 2 {
                return Err(UserError::at(
                    span,
                    format!("transpose needs rank >= 2, got {}", self.ty(x)),
                    "rank too low",
                    "reshape the tensor first",
                ));
            }
            perm.swap(a, b);
            perm
        };
        self.op(Op::Permute { perm }, vec![x], span)
    }

    /// `concat(a, b, ..., axis = 0)`.
    pub(super) fn concat(&mut self, args: &mut Args, span: Span) -> R<Val> {
        let parts = args.rest();
        let mut ids = Vec::new();
        for p in &parts {
            ids.push(self.tensor(p, "a part of `concat`")?);
        }
        let Some(&first) = ids.first() else {
            return Err(UserError::at(
                span,
                "`concat` needs at least one tensor",
                "no parts",
                "write `concat(a, b, axis = 1)`",
            ));
        };
        let rank = self.ty(first).shape.len();
        let a = self.axis_or(args, rank, 0)?;
        self.op(Op::Concat { axis: a }, ids, span)
    }

    /// `split(x, count, axis)` into equal parts, or `slice(x, start, end, axis)`; the axis is
    /// the last by default.
    pub(super) fn split(&mut self, name: &str, args: &mut Args, span: Span) -> R<Val> {
        let x = self.t(args, "input")?;
        let rank = self.ty(x).shape.len();
        let a = self.axis_or(args, rank, rank.saturating_sub(1))?;
        let extent = self.ty(x).shape.get(a).copied().unwrap_or(0);
        if name == "slice" {
            let s = args.positional("start")?;
            let e = args.positional("end")?;
            let (s, e) = (self.int(&s, "start")?, self.int(&e, "end")?);
            let (s, e) = (
                s.clamp(0, extent as i64) as usize,
                e.clamp(0, extent as i64) as usize,
            );
            return self.op(
                Op::Slice {
                    axis: a,
                    start: s,
                    end: e,
                },
                vec![x],
                span,
            );
        }
        let nv = args.positional("count")?;
        let n = self.dim(&nv, "the split count")?;
        if extent % n != 0 {
            return Err(UserError::at(
                nv.span,
                format!(
                    "cannot split {} into {n} equal parts along axis {a}",
                    self.ty(x)
                ),
                "does not divide",
                format!("the axis has {extent} elements"),
            ));
        }
        let part = extent / n;
        let mut vals = Vec::new();
        for i in 0..n {
            vals.push(Val::Tensor(self.add(
                Op::Slice {
                    axis: a,
                    start: i * part,
                    end: (i + 1) * part,
                },
                vec![x],
                span,
            )?));
        }
        Ok(Val::Tuple(vals))
    }

    /// The dims of a shape argument, a -1 among them inferred from `numel` elements.
    fn shape_with_infer(&self, v: &Spanned, numel: u64) -> R<Vec<usize>> {
        let items = match &v.val {
            Val::Tuple(items) => items.clone(),
            other => vec![other.clone()],
        };
        let mut dims: Vec<i64> = Vec::new();
        for i in items {
            dims.push(self.int(
                &Spanned {
                    val: i,
                    span: v.span,
                },
                "a shape dim",
            )?);
        }
        let known: i64 = dims.iter().filter(|&&d| d != -1).product();
        let unknown = dims.iter().filter(|&&d| d == -1).count();
        if unknown > 1 || dims.iter().any(|&d| d == 0 || d < -1) || known <= 0 {
            return Err(UserError::at(
                v.span,
                "a shape needs positive dims and at most one -1",
                "bad shape",
                "write e.g. `(B, T, H, -1)`",
            ));
        }
        Ok(dims
            .iter()
            .map(|&d| {
                if d == -1 {
                    (numel as i64 / known).max(1) as usize
                } else {
                    d as usize
                }
            })
            .collect())
    }
}
