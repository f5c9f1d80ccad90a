//! Built-in functions and parameter constructors; sugar (`linear`, `mlp`, `mean`, `flatten`,
//! `upsample`, ...) lowers to core ops here. This module evaluates a call's arguments and
//! dispatches by name; each family of built-ins lives in its own file: [`layers`] (unary
//! functions, norms, linear layers, embeddings, losses, dropout, attention), [`shape`]
//! (reductions, softmax, reshaping, slicing), [`select`] (extrema, comparisons, `where`,
//! `clamp`), [`spatial`] (NCHW convolution, pooling,
//! padding, resampling) and [`params`] (parameter constructors).

mod batchnorm;
mod conv;
mod layers;
mod params;
mod select;
mod shape;
mod spatial;

use super::ast::{Call, Ident};
use super::lower::{Lowerer, R};
use super::value::{Spanned, Val};
use crate::diagnostic::UserError;
use crate::ir::*;
use std::collections::HashMap;

/// A call's evaluated arguments, consumed by name or position; leftovers are errors.
struct Args {
    func: String,
    span: Span,
    pos: Vec<Spanned>,
    kw: Vec<(Ident, Spanned)>,
    used_pos: usize,
}

impl Args {
    fn positional(&mut self, what: &str) -> R<Spanned> {
        let v = self.pos.get(self.used_pos).cloned().ok_or_else(|| {
            UserError::at(
                self.span,
                format!("`{}` is missing its {what} argument", self.func),
                "missing argument",
                format!("see the signature of `{}` in the README", self.func),
            )
        })?;
        self.used_pos += 1;
        Ok(v)
    }

    fn optional(&mut self, name: &str) -> Option<Spanned> {
        if let Some(i) = self.kw.iter().position(|(k, _)| k.name == name) {
            return Some(self.kw.remove(i).1);
        }
        None
    }

    fn rest(&mut self) -> Vec<Spanned> {
        let r = self.pos[self.used_pos..].to_vec();
        self.used_pos = self.pos.len();
        r
    }

    fn done(&self) -> R<()> {
        if let Some((k, _)) = self.kw.first() {
            return Err(UserError::at(
                k.span,
                format!("unknown argument `{}` for `{}`", k.name, self.func),
                "unknown argument",
                format!("check the arguments of `{}`", self.func),
            ));
        }
        if let Some(extra) = self.pos.get(self.used_pos) {
            return Err(UserError::at(
                extra.span,
                format!("too many arguments for `{}`", self.func),
                "extra argument",
                format!(
                    "`{}` takes {} positional argument(s)",
                    self.func, self.used_pos
                ),
            ));
        }
        Ok(())
    }
}

fn axis(l: &Lowerer, v: &Spanned, rank: usize) -> R<usize> {
    let a = l.int(v, "an axis")?;
    normalize_axis(a, rank).ok_or_else(|| {
        UserError::at(
            v.span,
            format!("axis {a} is out of range for rank {rank}"),
            "bad axis",
            format!("use -{rank}..{rank}"),
        )
    })
}

fn pair(l: &Lowerer, v: Option<Spanned>, default: usize, what: &str) -> R<[usize; 2]> {
    let v = per_axis(l, v, default, what, 2)?;
    Ok([v[0], v[1]])
}

/// One non-negative integer per spatial axis: `default` for each when absent, one integer for
/// all `rank` axes, or a tuple of `rank` integers.
fn per_axis(
    l: &Lowerer,
    v: Option<Spanned>,
    default: usize,
    what: &str,
    rank: usize,
) -> R<Vec<usize>> {
    let Some(v) = v else {
        return Ok(vec![default; rank]);
    };
    let item = |val: &Val| -> R<usize> {
        let s = Spanned {
            val: val.clone(),
            span: v.span,
        };
        let i = l.int(&s, what)?;
        usize::try_from(i).map_err(|_| {
            UserError::at(
                v.span,
                format!("{what} must not be negative"),
                "negative",
                "use 0 or more",
            )
        })
    };
    match &v.val {
        Val::Tuple(items) if items.len() == rank => items.iter().map(item).collect(),
        Val::Tuple(items) => Err(UserError::at(
            v.span,
            format!("{what} has {} values for {rank} spatial axes", items.len()),
            "wrong count",
            format!("give one value, or a tuple of {rank}"),
        )),
        other => Ok(vec![item(other)?; rank]),
    }
}

/// Padding as `p`, `(rows, cols)` or `(top, left, bottom, right)` (ONNX order).
fn pads4(l: &Lowerer, v: Option<Spanned>) -> R<[usize; 4]> {
    if let Some(Spanned {
        val: Val::Tuple(items),
        span,
    }) = &v
    {
        if items.len() == 4 {
            let mut out = [0; 4];
            for (o, item) in out.iter_mut().zip(items) {
                let s = Spanned {
                    val: item.clone(),
                    span: *span,
                };
                *o = pair(l, Some(s), 0, "padding")?[0];
            }
            return Ok(out);
        }
    }
    let [r, c] = pair(l, v, 0, "padding")?;
    Ok([r, c, r, c])
}

fn boolean(v: Option<Spanned>, default: bool) -> R<bool> {
    match v {
        None => Ok(default),
        Some(Spanned {
            val: Val::Symbol(s),
            ..
        }) if s == "true" => Ok(true),
        Some(Spanned {
            val: Val::Symbol(s),
            ..
        }) if s == "false" => Ok(false),
        Some(v) => Err(UserError::at(
            v.span,
            "expected `true` or `false`",
            "not a boolean",
            "write `true` or `false`",
        )),
    }
}

impl Lowerer<'_> {
    /// Evaluates a call: a block instance, a built-in function, or an error naming the callee.
    pub(in crate::front) fn call(
        &mut self,
        call: &Call,
        env: &HashMap<String, Spanned>,
    ) -> R<Spanned> {
        let mut args = self.args(call, env)?;
        let name = call.name.name.as_str();
        if let Some(def) = self.block(name) {
            if let Some((k, _)) = args.kw.first() {
                return Err(UserError::at(
                    k.span,
                    "blocks take positional arguments",
                    "keyword",
                    "pass arguments in order",
                ));
            }
            return self.instantiate(def, args.pos, None, call.span);
        }
        let val = self.builtin(name, &mut args, call)?;
        args.done()?;
        Ok(Spanned {
            val,
            span: call.span,
        })
    }

    /// The evaluated arguments of `call`, positional and keyword, in source order.
    fn args(&mut self, call: &Call, env: &HashMap<String, Spanned>) -> R<Args> {
        let mut pos = Vec::new();
        let mut kw = Vec::new();
        for a in &call.args {
            let v = self.eval(&a.value, env)?;
            match &a.name {
                Some(n) => kw.push((n.clone(), v)),
                None => pos.push(v),
            }
        }
        Ok(Args {
            func: call.name.name.clone(),
            span: call.span,
            pos,
            kw,
            used_pos: 0,
        })
    }

    /// The next positional argument, which must be a tensor.
    fn t(&mut self, args: &mut Args, what: &str) -> R<ValueId> {
        let v = args.positional(what)?;
        self.tensor(&v, &format!("the {what} argument of `{}`", args.func))
    }

    /// The next positional argument, which must be a positive integer.
    fn dim_arg(&self, args: &mut Args, what: &str) -> R<usize> {
        let v = args.positional(what)?;
        self.dim(&v, what)
    }

    /// Keyword argument `name` as a number, or `default` when absent.
    fn float_or(&self, args: &mut Args, name: &str, default: f32) -> R<f32> {
        match args.optional(name) {
            Some(v) => Ok(self.float(&v, name)? as f32),
            None => Ok(default),
        }
    }

    /// Keyword argument `name` as a positive integer, or `default` when absent.
    fn dim_or(&self, args: &mut Args, name: &str, default: usize) -> R<usize> {
        match args.optional(name) {
            Some(v) => self.dim(&v, name),
            None => Ok(default),
        }
    }

    /// Keyword argument `axis` normalized for `rank`, or `default` when absent.
    fn axis_or(&self, args: &mut Args, rank: usize, default: usize) -> R<usize> {
        match args.optional("axis") {
            Some(v) => axis(self, &v, rank),
            None => Ok(default),
        }
    }

    fn op(&mut self, op: Op, inputs: Vec<ValueId>, span: Span) -> R<Val> {
        Ok(Val::Tensor(self.add(op, inputs, span)?))
    }

    /// Lowers the built-in function `name` applied to `args`.
    fn builtin(&mut self, name: &str, args: &mut Args, call: &Call) -> R<Val> {
        let span = call.span;
        if let Some(f) = layers::unary_fn(name) {
            return self.unary(f, args, span);
        }
        if let Some(f) = select::binary_fn(name) {
            return self.selection(f, args, span);
        }
        match name {
            "sum" | "mean" | "max" => self.reduce(name, args, span),
            "softmax" | "log_softmax" => self.softmax(name, args, span),
            "layernorm" | "rmsnorm" | "batchnorm" | "groupnorm" => self.norm(name, args, span),
            "linear" => self.linear_call(args, span),
            "mlp" => self.mlp(args, span),
            "embed" => self.embed(args, span),
            "cross_entropy" => self.cross_entropy(args, span),
            "mse" => self.mse(args, span),
            "reshape" => self.reshape(args, span),
            "expand" => self.expand(args, span),
            "flatten" => self.flatten(args, span),
            "transpose" | "permute" => self.transpose(name, args, span),
            "concat" => self.concat(args, span),
            "split" | "slice" => self.split(name, args, span),
            "conv1d" | "conv2d" | "conv3d" | "conv_transpose1d" | "conv_transpose2d"
            | "conv_transpose3d" => self.conv(name, args, span),
            "max_pool2d" | "avg_pool2d" => self.pool(name, args, span),
            "max_pool3d" | "avg_pool3d" => self.pool3d(name, args, span),
            "lrn" => self.lrn(args, span),
            "pad" => self.pad_call(args, span),
            "global_avg_pool" => self.global_avg_pool(args, span),
            "upsample" => self.upsample(args, span),
            "dropout" => self.dropout(args, span),
            "attention" => self.attention(args, span),
            "rope" => self.rope(args, span),
            "where" => self.where_call(args, span),
            "clamp" => self.clamp(args, span),
            _ => Err(UserError::at(
                call.name.span,
                format!("unknown function `{name}`"),
                "not defined",
                "see the README for the built-in functions; blocks must be defined before use",
            )),
        }
    }

    /// The required `heads = N` argument; `usage` shows a correct call.
    fn heads(&self, args: &mut Args, usage: &str) -> R<usize> {
        let Some(v) = args.optional("heads") else {
            return Err(UserError::at(
                args.span,
                format!("`{}` needs `heads = N`", args.func),
                "missing heads",
                format!("write `{usage}`"),
            ));
        };
        self.dim(&v, "heads")
    }

    /// The shape of `x`, which `func` needs to be NCL, NCHW or NCDHW (rank 3 to 5).
    fn spatial(&self, x: ValueId, func: &str, span: Span) -> R<Vec<usize>> {
        let help = "pass a [N, C, spatial...] tensor with 1 to 3 spatial axes";
        self.layout_shape(x, func, span, (3, 5), help)
    }

    /// The shape of `x`, which `func` needs to be `[N, C, H, W]`.
    fn nchw(&self, x: ValueId, func: &str, span: Span) -> R<Vec<usize>> {
        self.layout_shape(x, func, span, (4, 4), "pass a [N, C, H, W] tensor")
    }

    /// The shape of `x`, which `func` needs to have rank `lo..=hi` (NCL, NCHW, NCDHW among
    /// them), or a diagnostic naming those layouts with `help`.
    fn layout_shape(
        &self,
        x: ValueId,
        func: &str,
        span: Span,
        (lo, hi): (usize, usize),
        help: &str,
    ) -> R<Vec<usize>> {
        let ty = self.ty(x);
        if (lo..=hi).contains(&ty.shape.len()) {
            return Ok(ty.shape.clone());
        }
        let names: Vec<&str> = (lo..=hi)
            .map(|r| ["NCL", "NCHW", "NCDHW"][r.clamp(3, 5) - 3])
            .collect();
        let layouts = match names.split_last() {
            Some((last, [])) => last.to_string(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        };
        Err(UserError::at(
            span,
            format!("{func} needs an {layouts} tensor, got {ty}"),
            format!("not {layouts}"),
            help,
        ))
    }
}
