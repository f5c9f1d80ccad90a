//! Built-in layers: unary functions, norms, `linear`, `mlp`, embeddings, losses, dropout,
//! attention and rotary embeddings.

use super::{boolean, Args};
use crate::diagnostic::UserError;
use crate::front::lower::{Lowerer, R};
use crate::front::value::{Group, GroupKind, Spanned, Val};
use crate::ir::*;

/// The unary function a built-in name calls: the first of [`UnaryFn::ALL`] with that
/// [`UnaryFn::name`] (`gelu` is the tanh form; `exact = true` picks the erf form).
pub(super) fn unary_fn(name: &str) -> Option<UnaryFn> {
    UnaryFn::ALL.iter().copied().find(|f| f.name() == name)
}

/// The `window = W` of a causal attention: a whole number of keys, at least 1.
fn window(v: Option<Spanned>, causal: bool) -> R<Option<usize>> {
    let Some(v) = v else { return Ok(None) };
    let usage = "write how many keys a query sees, itself included: `window = 4096`";
    let w = match v.val {
        Val::Int(w) if w >= 1 => w as usize,
        Val::Int(w) => {
            return Err(UserError::at(
                v.span,
                format!("attention window must be at least 1, got {w}"),
                "not positive",
                usage,
            ))
        }
        ref other => {
            let got = match other {
                Val::Float(f) => f.to_string(),
                _ => other.describe().to_string(),
            };
            return Err(UserError::at(
                v.span,
                format!("attention window must be a whole number of keys, got {got}"),
                "not a key count",
                usage,
            ));
        }
    };
    if !causal {
        return Err(UserError::at(
            v.span,
            "a window is only defined here for causal attention",
            "window without `causal = true`",
            "add `causal = true`: query i then sees keys j with i - W < j <= i",
        ));
    }
    Ok(Some(w))
}

/// The `softcap = C` of an attention: a positive number.
fn softcap(lw: &Lowerer, v: Option<Spanned>) -> R<Option<f32>> {
    let Some(v) = v else { return Ok(None) };
    let c = lw.float(&v, "attention softcap")?;
    if c > 0.0 && c.is_finite() {
        return Ok(Some(c as f32));
    }
    Err(UserError::at(
        v.span,
        format!("attention softcap must be a positive number, got {c}"),
        "not positive",
        "write the cap of the scores, each becoming C tanh(s / C): `softcap = 50.0`",
    ))
}

impl Lowerer<'_> {
    /// `f(x)`; `gelu(x, exact = true)` is the erf form.
    pub(super) fn unary(&mut self, mut f: UnaryFn, args: &mut Args, span: Span) -> R<Val> {
        let x = self.t(args, "input")?;
        if f == UnaryFn::GeluTanh && boolean(args.optional("exact"), false)? {
            f = UnaryFn::GeluErf;
        }
        self.op(Op::Unary(f), vec![x], span)
    }

    /// `x @ weight (+ bias)` of a `linear` group.
    fn linear(&mut self, x: ValueId, g: &Group, span: Span) -> R<ValueId> {
        let out_in = matches!(g.kind, GroupKind::Linear { out_in: true });
        let y = self.add(Op::matmul(false, out_in), vec![x, g.weight], span)?;
        match g.bias {
            Some(b) => self.add(Op::Binary(BinaryFn::Add), vec![y, b], span),
            None => Ok(y),
        }
    }

    /// The next positional argument, which must be a parameter group of kind `want`;
    /// `what` names the argument and `context` the place it is used in diagnostics.
    pub(super) fn group_arg(
        &self,
        args: &mut Args,
        what: &str,
        context: &str,
        want: &str,
    ) -> R<Group> {
        let gv = args.positional(what)?;
        let g = self.group(&gv, context)?;
        if g.kind.name() != want {
            return Err(UserError::at(
                gv.span,
                format!(
                    "expected a `{want}` parameter group, got `{}`",
                    g.kind.name()
                ),
                "wrong parameter kind",
                format!("declare it as `param name: {want}(...)`"),
            ));
        }
        Ok(g)
    }

    /// `layernorm`, `rmsnorm`, `batchnorm` or `groupnorm` of `x` with its parameter group.
    pub(super) fn norm(&mut self, name: &str, args: &mut Args, span: Span) -> R<Val> {
        let x = self.t(args, "input")?;
        let g = self.group_arg(args, "parameter", "the second argument", name)?;
        let default_eps = if name == "rmsnorm" { 1e-6 } else { 1e-5 };
        let eps = self.float_or(args, "eps", default_eps)?;
        // `offset = 1` scales by `1 + weight` (Gemma's norms store the weight that way).
        let offset = self.float_or(args, "offset", 0.0)?;
        let kind = match g.kind {
            GroupKind::LayerNorm => NormKind::Layer,
            GroupKind::RmsNorm => NormKind::Rms,
            GroupKind::BatchNorm => NormKind::Batch,
            GroupKind::GroupNorm(n) => NormKind::Group(n),
            _ => NormKind::Layer,
        };
        let weight = if offset == 0.0 {
            g.weight
        } else {
            self.add(
                Op::Affine {
                    scale: 1.0,
                    shift: offset,
                },
                vec![g.weight],
                span,
            )?
        };
        if let Some(running) = g.running {
            let momentum = self.float_or(args, "momentum", 0.1)?;
            return self.batch_norm(x, (weight, g.bias), running, (eps, momentum), span);
        }
        let mut inputs = vec![x, weight];
        inputs.extend(g.bias);
        self.op(Op::norm(kind, eps), inputs, span)
    }

    /// `linear(x, layer)`.
    pub(super) fn linear_call(&mut self, args: &mut Args, span: Span) -> R<Val> {
        let x = self.t(args, "input")?;
        let g = self.group_arg(
            args,
            "parameter",
            "the second argument of `linear`",
            "linear",
        )?;
        Ok(Val::Tensor(self.linear(x, &g, span)?))
    }

    /// `mlp(x, first, second, act = gelu)`: two linear layers with an activation between.
    pub(super) fn mlp(&mut self, args: &mut Args, span: Span) -> R<Val> {
        let x = self.t(args, "input")?;
        let mut groups = Vec::new();
        for what in ["first layer", "second layer"] {
            groups.push(self.group_arg(args, what, "an `mlp` layer", "linear")?);
        }
        let act = match args.optional("act") {
            None => UnaryFn::GeluTanh,
            Some(Spanned {
                val: Val::Symbol(s),
                span: s_span,
            }) => unary_fn(&s).ok_or_else(|| {
                UserError::at(
                    s_span,
                    format!("unknown activation `{s}`"),
                    "not an activation",
                    "use relu, gelu, silu, tanh or sigmoid",
                )
            })?,
            Some(v) => {
                return Err(UserError::at(
                    v.span,
                    "`act` must name an activation",
                    "not an activation",
                    "write `act = gelu`",
                ))
            }
        };
        let h = self.linear(x, &groups[0], span)?;
        let h = self.add(Op::Unary(act), vec![h], span)?;
        Ok(Val::Tensor(self.linear(h, &groups[1], span)?))
    }

    /// `embed(table, ids, padding_idx = P)`: rows of a table (an `embedding` group or a
    /// tensor); ids equal to P (a row of the table) send no gradient to it.
    pub(super) fn embed(&mut self, args: &mut Args, span: Span) -> R<Val> {
        let tv = args.positional("table")?;
        let table = match &tv.val {
            Val::Group(g) => g.weight,
            _ => self.tensor(&tv, "the table of `embed`")?,
        };
        let ids = self.t(args, "ids")?;
        let rows = self.ty(table).shape.first().copied().unwrap_or(0);
        let padding_idx = match args.optional("padding_idx") {
            None => None,
            Some(v) => {
                let i = self.int(&v, "padding_idx")?;
                if !(0..rows as i64).contains(&i) {
                    return Err(UserError::at(
                        v.span,
                        format!("padding_idx {i} is not a row of the {rows}-row table"),
                        "not a row",
                        format!(
                            "give the id of the padding token, from 0 to {}",
                            rows.max(1) - 1
                        ),
                    ));
                }
                Some(i as usize)
            }
        };
        self.op(Op::Embedding { padding_idx }, vec![table, ids], span)
    }

    /// `cross_entropy(logits, targets, ignore_index = K)`: with `K`, the rows whose target is
    /// `K` take no loss and no gradient, and the mean divides by the `kept_count` of the
    /// targets, made here once for the forward and the backward.
    pub(super) fn cross_entropy(&mut self, args: &mut Args, span: Span) -> R<Val> {
        let logits = self.t(args, "logits")?;
        let targets = self.t(args, "targets")?;
        let ignore_index = match args.optional("ignore_index") {
            Some(v) => Some(ignore_index(&v)?),
            None => None,
        };
        let ce = CeParams { ignore_index };
        let mut inputs = vec![logits, targets];
        if ignore_index.is_some() {
            inputs.push(self.add(Op::KeptCount(ce), vec![targets], span)?);
        }
        self.op(Op::CrossEntropy(ce), inputs, span)
    }

    /// `mse(prediction, target)`, which weighs every element: `ignore_index` is refused.
    pub(super) fn mse(&mut self, args: &mut Args, span: Span) -> R<Val> {
        let a = self.t(args, "prediction")?;
        let b = self.t(args, "target")?;
        if let Some(v) = args.optional("ignore_index") {
            return Err(UserError::at(
                v.span,
                "`ignore_index` applies to `cross_entropy` only, not to `mse`",
                "not an argument of `mse`",
                "mse averages every element; drop `ignore_index`",
            ));
        }
        self.op(Op::Mse, vec![a, b], span)
    }

    /// `dropout(x, p = 0.1)`, each call with its own seed; in an inference model (no
    /// `train { }`) the identity, as in eval mode.
    pub(super) fn dropout(&mut self, args: &mut Args, span: Span) -> R<Val> {
        let x = self.t(args, "input")?;
        let p = self.float_or(args, "p", 0.1)?;
        if !self.training {
            return Ok(Val::Tensor(x));
        }
        let seed = self.next_seed;
        self.next_seed += 1;
        self.op(Op::Dropout { p, seed }, vec![x], span)
    }

    /// `attention(q, k, v, heads = H, kv_heads, causal, scale, window, softcap, key_mask)`; a
    /// key mask of the wrong shape or dtype, or a softcap not positive, is an error at the
    /// argument.
    pub(super) fn attention(&mut self, args: &mut Args, span: Span) -> R<Val> {
        let q = self.t(args, "q")?;
        let k = self.t(args, "k")?;
        let v = self.t(args, "v")?;
        let mut inputs = vec![q, k, v];
        if let Some(m) = args.optional("key_mask") {
            let mask = self.tensor(&m, "the key_mask argument of `attention`")?;
            let (q, k, mask_ty) = (self.ty(q), self.ty(k), self.ty(mask));
            crate::ops::attention::key_mask(q, k, mask_ty)
                .map_err(|e| UserError::at(m.span, e.message, "this key mask", e.help))?;
            inputs.push(mask);
        }
        let heads = self.heads(args, "attention(q, k, v, heads = H)")?;
        let kv_heads = self.dim_or(args, "kv_heads", heads)?;
        let causal = boolean(args.optional("causal"), false)?;
        let window = window(args.optional("window"), causal)?;
        let width = self.ty(q).shape.last().copied().unwrap_or(1);
        let default_scale = 1.0 / ((width / heads.max(1)).max(1) as f32).sqrt();
        let scale = self.float_or(args, "scale", default_scale)?;
        let softcap = softcap(self, args.optional("softcap"))?;
        self.op(
            Op::Attention(AttnParams {
                heads,
                kv_heads,
                causal,
                scale,
                window,
                softcap,
                key_mask: inputs.len() == 4,
            }),
            inputs,
            span,
        )
    }

    /// `rope(x, heads = H, base = 10000)`: rotary position embedding.
    pub(super) fn rope(&mut self, args: &mut Args, span: Span) -> R<Val> {
        let x = self.t(args, "input")?;
        let heads = self.heads(args, "rope(q, heads = H)")?;
        let base = self.float_or(args, "base", 10000.0)?;
        self.op(
            Op::Rope {
                heads,
                base,
                inverse: false,
            },
            vec![x],
            span,
        )
    }
}

/// The target id a cross-entropy ignores: an integer that fits the i32 targets (it may name a
/// class: PyTorch allows that too).
fn ignore_index(v: &Spanned) -> R<i32> {
    let help = "write the target id to ignore, e.g. `ignore_index = -100`";
    match v.val {
        Val::Int(i) => i32::try_from(i).map_err(|_| {
            UserError::at(
                v.span,
                format!("ignore_index {i} does not fit the i32 targets"),
                "outside the i32 range",
                help,
            )
        }),
        Val::Float(f) => Err(UserError::at(
            v.span,
            format!("ignore_index must be an integer, got {f}"),
            "not an integer",
            help,
        )),
        ref other => Err(UserError::at(
            v.span,
            format!("ignore_index must be an integer, got {}", other.describe()),
            "not an integer",
            help,
        )),
    }
}
