//! Built-in functions and parameter constructors; sugar (`linear`, `mlp`, `mean`, `flatten`,
//! `upsample`, ...) lowers to core ops here.

use super::ast::{Call, Ident};
use super::lower::{Lowerer, R};
use super::value::{Group, GroupKind, Spanned, Val};
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
    let Some(v) = v else {
        return Ok([default, default]);
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
        Val::Tuple(items) if items.len() == 2 => Ok([item(&items[0])?, item(&items[1])?]),
        other => {
            let x = item(other)?;
            Ok([x, x])
        }
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

fn unary_fn(name: &str) -> Option<UnaryFn> {
    Some(match name {
        "neg" => UnaryFn::Neg,
        "exp" => UnaryFn::Exp,
        "log" => UnaryFn::Log,
        "sqrt" => UnaryFn::Sqrt,
        "rsqrt" => UnaryFn::Rsqrt,
        "tanh" => UnaryFn::Tanh,
        "sigmoid" => UnaryFn::Sigmoid,
        "relu" => UnaryFn::Relu,
        "silu" => UnaryFn::Silu,
        "gelu" => UnaryFn::GeluTanh,
        "erf" => UnaryFn::Erf,
        _ => return None,
    })
}

impl Lowerer<'_> {
    /// Evaluates a call: a block instance, a built-in function, or an error naming the callee.
    pub(super) fn call(&mut self, call: &Call, env: &HashMap<String, Spanned>) -> R<Spanned> {
        let mut pos = Vec::new();
        let mut kw = Vec::new();
        for a in &call.args {
            let v = self.eval(&a.value, env)?;
            match &a.name {
                Some(n) => kw.push((n.clone(), v)),
                None => pos.push(v),
            }
        }
        let name = call.name.name.as_str();
        if let Some(def) = self.block(name) {
            if let Some((k, _)) = kw.first() {
                return Err(UserError::at(
                    k.span,
                    "blocks take positional arguments",
                    "keyword",
                    "pass arguments in order",
                ));
            }
            return self.instantiate(def, pos, call.span);
        }
        let mut args = Args {
            func: name.to_string(),
            span: call.span,
            pos,
            kw,
            used_pos: 0,
        };
        let val = self.builtin(name, &mut args, call)?;
        args.done()?;
        Ok(Spanned {
            val,
            span: call.span,
        })
    }

    fn t(&mut self, args: &mut Args, what: &str) -> R<ValueId> {
        let v = args.positional(what)?;
        self.tensor(&v, &format!("the {what} argument of `{}`", args.func))
    }

    fn op(&mut self, op: Op, inputs: Vec<ValueId>, span: Span) -> R<Val> {
        Ok(Val::Tensor(self.add(op, inputs, span)?))
    }

    fn linear(&mut self, x: ValueId, g: &Group, span: Span) -> R<ValueId> {
        let y = self.add(
            Op::MatMul {
                ta: false,
                tb: false,
            },
            vec![x, g.weight],
            span,
        )?;
        match g.bias {
            Some(b) => self.add(Op::Binary(BinaryFn::Add), vec![y, b], span),
            None => Ok(y),
        }
    }

    fn expect_kind(&self, g: &Group, want: &str, v_span: Span) -> R<()> {
        if g.kind.name() != want {
            return Err(UserError::at(
                v_span,
                format!(
                    "expected a `{want}` parameter group, got `{}`",
                    g.kind.name()
                ),
                "wrong parameter kind",
                format!("declare it as `param name: {want}(...)`"),
            ));
        }
        Ok(())
    }

    fn reduce(&mut self, name: &str, args: &mut Args, span: Span) -> R<Val> {
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
        let mut y = if name == "max" {
            self.add(
                Op::MaxTo {
                    shape: kept.clone(),
                },
                vec![x],
                span,
            )?
        } else {
            self.add(
                Op::SumTo {
                    shape: kept.clone(),
                },
                vec![x],
                span,
            )?
        };
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

    fn norm(&mut self, name: &str, args: &mut Args, span: Span) -> R<Val> {
        let x = self.t(args, "input")?;
        let gv = args.positional("parameter")?;
        let g = self.group(&gv, "the second argument")?;
        self.expect_kind(&g, name, gv.span)?;
        let default_eps = if name == "rmsnorm" { 1e-6 } else { 1e-5 };
        let eps = match args.optional("eps") {
            Some(v) => self.float(&v, "eps")? as f32,
            None => default_eps,
        };
        let kind = match g.kind {
            GroupKind::LayerNorm => NormKind::Layer,
            GroupKind::RmsNorm => NormKind::Rms,
            GroupKind::BatchNorm => NormKind::Batch,
            GroupKind::GroupNorm(n) => NormKind::Group(n),
            _ => NormKind::Layer,
        };
        let mut inputs = vec![x, g.weight];
        inputs.extend(g.bias);
        self.op(Op::Norm { kind, eps }, inputs, span)
    }

    fn builtin(&mut self, name: &str, args: &mut Args, call: &Call) -> R<Val> {
        let span = call.span;
        if let Some(mut f) = unary_fn(name) {
            let x = self.t(args, "input")?;
            if name == "gelu" && boolean(args.optional("exact"), false)? {
                f = UnaryFn::GeluErf;
            }
            return self.op(Op::Unary(f), vec![x], span);
        }
        match name {
            "sum" | "mean" | "max" => self.reduce(name, args, span),
            "softmax" | "log_softmax" => {
                let x = self.t(args, "input")?;
                let rank = self.ty(x).shape.len();
                let a = match args.optional("axis") {
                    Some(v) => axis(self, &v, rank)?,
                    None => rank.saturating_sub(1),
                };
                let op = if name == "softmax" {
                    Op::Softmax { axis: a }
                } else {
                    Op::LogSoftmax { axis: a }
                };
                self.op(op, vec![x], span)
            }
            "layernorm" | "rmsnorm" | "batchnorm" | "groupnorm" => self.norm(name, args, span),
            "linear" => {
                let x = self.t(args, "input")?;
                let gv = args.positional("parameter")?;
                let g = self.group(&gv, "the second argument of `linear`")?;
                self.expect_kind(&g, "linear", gv.span)?;
                Ok(Val::Tensor(self.linear(x, &g, span)?))
            }
            "mlp" => {
                let x = self.t(args, "input")?;
                let mut groups = Vec::new();
                for what in ["first layer", "second layer"] {
                    let gv = args.positional(what)?;
                    let g = self.group(&gv, "an `mlp` layer")?;
                    self.expect_kind(&g, "linear", gv.span)?;
                    groups.push(g);
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
            "embed" => {
                let tv = args.positional("table")?;
                let table = match &tv.val {
                    Val::Group(g) => g.weight,
                    _ => self.tensor(&tv, "the table of `embed`")?,
                };
                let ids = self.t(args, "ids")?;
                self.op(Op::Embedding, vec![table, ids], span)
            }
            "cross_entropy" => {
                let logits = self.t(args, "logits")?;
                let targets = self.t(args, "targets")?;
                self.op(Op::CrossEntropy, vec![logits, targets], span)
            }
            "mse" => {
                let a = self.t(args, "prediction")?;
                let b = self.t(args, "target")?;
                self.op(Op::Mse, vec![a, b], span)
            }
            "reshape" => {
                let x = self.t(args, "input")?;
                let sv = args.positional("shape")?;
                let shape = self.shape_with_infer(&sv, self.ty(x).numel())?;
                self.op(Op::Reshape { shape }, vec![x], span)
            }
            "flatten" => {
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
            "transpose" | "permute" => {
                let x = self.t(args, "input")?;
                let rank = self.ty(x).shape.len();
                let perm = if name == "permute" {
                    let pv = args.positional("permutation")?;
                    axes_in_order(self, &pv, rank)?
                } else {
                    let mut perm: Vec<usize> = (0..rank).collect();
                    let a = args
                        .pos
                        .get(1)
                        .map(|v| axis(self, v, rank))
                        .transpose()?
                        .unwrap_or(rank.saturating_sub(2));
                    let b = args
                        .pos
                        .get(2)
                        .map(|v| axis(self, v, rank))
                        .transpose()?
                        .unwrap_or(rank.saturating_sub(1));
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
            "concat" => {
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
                let a = match args.optional("axis") {
                    Some(v) => axis(self, &v, rank)?,
                    None => 0,
                };
                self.op(Op::Concat { axis: a }, ids, span)
            }
            "split" | "slice" => {
                let x = self.t(args, "input")?;
                let rank = self.ty(x).shape.len();
                let a = match args.optional("axis") {
                    Some(v) => axis(self, &v, rank)?,
                    None => rank.saturating_sub(1),
                };
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
            "conv2d" => {
                let x = self.t(args, "input")?;
                let gv = args.positional("parameter")?;
                let g = self.group(&gv, "the second argument of `conv2d`")?;
                let GroupKind::Conv2d { groups } = g.kind else {
                    return Err(UserError::at(
                        gv.span,
                        format!(
                            "expected a `conv2d` parameter group, got `{}`",
                            g.kind.name()
                        ),
                        "wrong parameter kind",
                        "declare it as `param c: conv2d(in, out, k)`",
                    ));
                };
                let pads = pads4(self, args.optional("padding"))?;
                let (x, padding) = self.pad_for(x, pads, 0.0, span)?;
                let conv = ConvParams {
                    stride: pair(self, args.optional("stride"), 1, "stride")?,
                    padding,
                    dilation: pair(self, args.optional("dilation"), 1, "dilation")?,
                    groups,
                };
                if conv.stride.contains(&0) || conv.dilation.contains(&0) {
                    return Err(UserError::at(
                        span,
                        "stride and dilation must be at least 1",
                        "zero",
                        "use 1 or more",
                    ));
                }
                let y = self.add(Op::Conv2d(conv), vec![x, g.weight], span)?;
                match g.bias {
                    Some(b) => {
                        let c = self.ty(b).shape[0];
                        let b4 = self.add(
                            Op::Reshape {
                                shape: vec![c, 1, 1],
                            },
                            vec![b],
                            span,
                        )?;
                        self.op(Op::Binary(BinaryFn::Add), vec![y, b4], span)
                    }
                    None => Ok(Val::Tensor(y)),
                }
            }
            "max_pool2d" | "avg_pool2d" => {
                let x = self.t(args, "input")?;
                let kv = args.positional("kernel")?;
                let kernel = pair(self, Some(kv), 1, "kernel")?;
                let stride = pair(self, args.optional("stride"), 0, "stride")?;
                let stride = if stride == [0, 0] { kernel } else { stride };
                let pads = pads4(self, args.optional("padding"))?;
                let count_pad = boolean(args.optional("count_pad"), true)?;
                if kernel.contains(&0) || stride.contains(&0) {
                    return Err(UserError::at(
                        span,
                        "kernel and stride must be at least 1",
                        "zero",
                        "use 1 or more",
                    ));
                }
                let shape = self.nchw(x, name, span)?;
                let is_max = name == "max_pool2d";
                let fill = if is_max { f32::NEG_INFINITY } else { 0.0 };
                let (xp, padding) = self.pad_for(x, pads, fill, span)?;
                let p = PoolParams {
                    kernel,
                    stride,
                    padding,
                };
                if is_max {
                    return self.op(Op::MaxPool2d(p), vec![xp], span);
                }
                let y = self.add(Op::AvgPool2d(p), vec![xp], span)?;
                if count_pad || pads == [0; 4] {
                    return Ok(Val::Tensor(y));
                }
                // Padding not counted: divide by the share of each window inside the input.
                let ones = self.add(
                    Op::Fill {
                        value: 1.0,
                        ty: TensorType::new(DType::F32, vec![1, 1, shape[2], shape[3]]),
                    },
                    vec![],
                    span,
                )?;
                let (ones, _) = self.pad_for(ones, pads, 0.0, span)?;
                let share = self.add(Op::AvgPool2d(p), vec![ones], span)?;
                self.op(Op::Binary(BinaryFn::Div), vec![y, share], span)
            }
            "lrn" => self.lrn(args, span),
            "pad" => {
                let x = self.t(args, "input")?;
                let pv = args.positional("padding")?;
                let pads = pads4(self, Some(pv))?;
                let value = match args.optional("value") {
                    Some(v) => self.float(&v, "value")? as f32,
                    None => 0.0,
                };
                self.nchw(x, "pad", span)?;
                Ok(Val::Tensor(self.pad(x, pads, value, span)?))
            }
            "global_avg_pool" => {
                let x = self.t(args, "input")?;
                let shape = self.nchw(x, "global_avg_pool", span)?;
                let s = self.add(
                    Op::SumTo {
                        shape: vec![shape[0], shape[1], 1, 1],
                    },
                    vec![x],
                    span,
                )?;
                let m = self.add(
                    Op::Affine {
                        scale: 1.0 / (shape[2] * shape[3]) as f32,
                        shift: 0.0,
                    },
                    vec![s],
                    span,
                )?;
                self.op(
                    Op::Reshape {
                        shape: vec![shape[0], shape[1]],
                    },
                    vec![m],
                    span,
                )
            }
            "upsample" => {
                let x = self.t(args, "input")?;
                let fv = args.positional("factor")?;
                let f = self.dim(&fv, "the upsample factor")?;
                let s = self.nchw(x, "upsample", span)?;
                let r = self.add(
                    Op::Reshape {
                        shape: vec![s[0], s[1], s[2], 1, s[3], 1],
                    },
                    vec![x],
                    span,
                )?;
                let b = self.add(
                    Op::BroadcastTo {
                        shape: vec![s[0], s[1], s[2], f, s[3], f],
                    },
                    vec![r],
                    span,
                )?;
                self.op(
                    Op::Reshape {
                        shape: vec![s[0], s[1], s[2] * f, s[3] * f],
                    },
                    vec![b],
                    span,
                )
            }
            "dropout" => {
                let x = self.t(args, "input")?;
                let p = match args.optional("p") {
                    Some(v) => self.float(&v, "p")? as f32,
                    None => 0.1,
                };
                let seed = self.next_seed;
                self.next_seed += 1;
                self.op(Op::Dropout { p, seed }, vec![x], span)
            }
            "attention" => {
                let q = self.t(args, "q")?;
                let k = self.t(args, "k")?;
                let v = self.t(args, "v")?;
                let heads = self.heads(args, "attention(q, k, v, heads = H)")?;
                let kv_heads = match args.optional("kv_heads") {
                    Some(v) => self.dim(&v, "kv_heads")?,
                    None => heads,
                };
                let causal = boolean(args.optional("causal"), false)?;
                let width = self.ty(q).shape.last().copied().unwrap_or(1);
                let scale = match args.optional("scale") {
                    Some(v) => self.float(&v, "scale")? as f32,
                    None => 1.0 / ((width / heads.max(1)).max(1) as f32).sqrt(),
                };
                self.op(
                    Op::Attention(AttnParams {
                        heads,
                        kv_heads,
                        causal,
                        scale,
                    }),
                    vec![q, k, v],
                    span,
                )
            }
            "rope" => {
                let x = self.t(args, "input")?;
                let heads = self.heads(args, "rope(q, heads = H)")?;
                let base = match args.optional("base") {
                    Some(v) => self.float(&v, "base")? as f32,
                    None => 10000.0,
                };
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
            _ => Err(UserError::at(
                call.name.span,
                format!("unknown function `{name}`"),
                "not defined",
                "see the README for the built-in functions; blocks must be defined before use",
            )),
        }
    }

    /// `(x, pads)` ready for a conv or pool: symmetric padding stays with the op; asymmetric
    /// `(top, left, bottom, right)` becomes explicit rows and columns of `value` around x.
    fn pad_for(
        &mut self,
        x: ValueId,
        pads: [usize; 4],
        value: f32,
        span: Span,
    ) -> R<(ValueId, [usize; 2])> {
        let [top, left, bottom, right] = pads;
        if top == bottom && left == right {
            return Ok((x, [top, left]));
        }
        Ok((self.pad(x, pads, value, span)?, [0, 0]))
    }

    /// `x` (NCHW) with `(top, left, bottom, right)` rows and columns of `value` around it,
    /// concatenated from filled tensors.
    fn pad(&mut self, x: ValueId, pads: [usize; 4], value: f32, span: Span) -> R<ValueId> {
        let [top, left, bottom, right] = pads;
        let mut y = x;
        for (axis, before, after) in [(2, top, bottom), (3, left, right)] {
            let shape = self.nchw(y, "padding", span)?;
            let fill = |l: &mut Self, rows: usize| {
                let mut s = shape.clone();
                s[axis] = rows;
                let ty = TensorType::new(DType::F32, s);
                l.add(Op::Fill { value, ty }, vec![], span)
            };
            let mut parts = Vec::new();
            if before > 0 {
                parts.push(fill(self, before)?);
            }
            parts.push(y);
            if after > 0 {
                parts.push(fill(self, after)?);
            }
            if parts.len() > 1 {
                y = self.add(Op::Concat { axis }, parts, span)?;
            }
        }
        Ok(y)
    }

    /// Local response normalization across channels (ONNX `LRN`):
    /// `x / (bias + alpha / size * sum of x^2 over the size-channel window)^beta`, lowered to
    /// square, an average pool over channels, affine, log, scale, exp and multiply.
    fn lrn(&mut self, args: &mut Args, span: Span) -> R<Val> {
        let x = self.t(args, "input")?;
        let s = self.nchw(x, "lrn", span)?;
        let size = match args.optional("size") {
            Some(v) => self.dim(&v, "size")?,
            None => 5,
        };
        let mut num = |name: &str, default: f64| -> R<f32> {
            Ok(match args.optional(name) {
                Some(v) => self.float(&v, name)? as f32,
                None => default as f32,
            })
        };
        let (alpha, beta, bias) = (num("alpha", 1e-4)?, num("beta", 0.75)?, num("bias", 1.0)?);
        let sq = self.add(Op::Binary(BinaryFn::Mul), vec![x, x], span)?;
        let r = self.add(
            Op::Reshape {
                shape: vec![s[0], 1, s[1], s[2] * s[3]],
            },
            vec![sq],
            span,
        )?;
        let before = (size - 1) / 2;
        let (rp, padding) = self.pad_for(r, [before, 0, size - 1 - before, 0], 0.0, span)?;
        let pool = PoolParams {
            kernel: [size, 1],
            stride: [1, 1],
            padding,
        };
        let mut d = self.add(Op::AvgPool2d(pool), vec![rp], span)?;
        for op in [
            Op::Affine {
                scale: alpha,
                shift: bias,
            },
            Op::Unary(UnaryFn::Log),
            Op::Affine {
                scale: -beta,
                shift: 0.0,
            },
            Op::Unary(UnaryFn::Exp),
            Op::Reshape { shape: s },
        ] {
            d = self.add(op, vec![d], span)?;
        }
        self.op(Op::Binary(BinaryFn::Mul), vec![x, d], span)
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

    /// The shape of `x`, which `func` needs to be `[N, C, H, W]`.
    fn nchw(&self, x: ValueId, func: &str, span: Span) -> R<Vec<usize>> {
        let ty = self.ty(x);
        if ty.shape.len() != 4 {
            return Err(UserError::at(
                span,
                format!("{func} needs an NCHW tensor, got {ty}"),
                "not NCHW",
                "pass a [N, C, H, W] tensor",
            ));
        }
        Ok(ty.shape.clone())
    }

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

    /// Creates the tensors of a parameter constructor such as `linear(I, O)`.
    pub(super) fn param_group(
        &mut self,
        name: &Ident,
        call: &Call,
        env: &HashMap<String, Spanned>,
    ) -> R<Val> {
        let mut pos = Vec::new();
        let mut kw = Vec::new();
        for a in &call.args {
            let v = self.eval(&a.value, env)?;
            match &a.name {
                Some(n) => kw.push((n.clone(), v)),
                None => pos.push(v),
            }
        }
        let ctor = call.name.name.as_str();
        let mut args = Args {
            func: ctor.to_string(),
            span: call.span,
            pos,
            kw,
            used_pos: 0,
        };
        let dim = |l: &Lowerer, args: &mut Args, what: &str| -> R<usize> {
            let v = args.positional(what)?;
            l.dim(&v, what)
        };
        let sub = |suffix: &str| Ident {
            name: format!("{}.{suffix}", name.name),
            span: name.span,
        };
        let f32t = |shape: Vec<usize>| TensorType::new(DType::F32, shape);
        let group = match ctor {
            "layernorm" | "batchnorm" | "rmsnorm" | "groupnorm" => {
                let groups = if ctor == "groupnorm" { dim(self, &mut args, "group count")? } else { 0 };
                let c = dim(self, &mut args, "channel count")?;
                let bias = ctor != "rmsnorm" && boolean(args.optional("bias"), true)?;
                let kind = match ctor {
                    "layernorm" => GroupKind::LayerNorm,
                    "batchnorm" => GroupKind::BatchNorm,
                    "rmsnorm" => GroupKind::RmsNorm,
                    _ => GroupKind::GroupNorm(groups),
                };
                let weight = self.new_param(&sub("weight"), f32t(vec![c]), Init::Ones)?;
                let bias = if bias { Some(self.new_param(&sub("bias"), f32t(vec![c]), Init::Zeros)?) } else { None };
                Group { kind, weight, bias }
            }
            "linear" => {
                let i = dim(self, &mut args, "input width")?;
                let o = dim(self, &mut args, "output width")?;
                let bound = 1.0 / (i as f32).sqrt();
                let init = match args.optional("std") {
                    Some(v) => Init::Normal { std: self.float(&v, "std")? as f32 },
                    None => Init::Uniform { low: -bound, high: bound },
                };
                let has_bias = boolean(args.optional("bias"), true)?;
                let weight = self.new_param(&sub("weight"), f32t(vec![i, o]), init)?;
                let bias = if has_bias { Some(self.new_param(&sub("bias"), f32t(vec![o]), Init::Zeros)?) } else { None };
                Group { kind: GroupKind::Linear, weight, bias }
            }
            "conv2d" => {
                let i = dim(self, &mut args, "input channels")?;
                let o = dim(self, &mut args, "output channels")?;
                let kv = args.positional("kernel size")?;
                let k = pair(self, Some(kv), 1, "kernel size")?;
                if k.contains(&0) {
                    return Err(UserError::at(call.span, "kernel size must be at least 1", "zero", "use 1 or more"));
                }
                let groups = match args.optional("groups") {
                    Some(v) => self.dim(&v, "groups")?,
                    None => 1,
                };
                if i % groups != 0 || o % groups != 0 {
                    return Err(UserError::at(call.span, format!("groups = {groups} must divide both {i} input and {o} output channels"), "does not divide", "choose groups dividing both channel counts"));
                }
                let has_bias = boolean(args.optional("bias"), false)?;
                let fan_in = (i / groups * k[0] * k[1]) as f32;
                let bound = 1.0 / fan_in.sqrt();
                let weight = self.new_param(&sub("weight"), f32t(vec![o, i / groups, k[0], k[1]]), Init::Uniform { low: -bound, high: bound })?;
                let bias = if has_bias { Some(self.new_param(&sub("bias"), f32t(vec![o]), Init::Zeros)?) } else { None };
                Group { kind: GroupKind::Conv2d { groups }, weight, bias }
            }
            "embedding" => {
                let v = dim(self, &mut args, "row count")?;
                let d = dim(self, &mut args, "width")?;
                let std = match args.optional("std") {
                    Some(s) => self.float(&s, "std")? as f32,
                    None => 1.0,
                };
                let weight = self.new_param(&sub("weight"), f32t(vec![v, d]), Init::Normal { std })?;
                Group { kind: GroupKind::Embedding, weight, bias: None }
            }
            _ => {
                return Err(UserError::at(call.name.span, format!("unknown parameter constructor `{ctor}`"), "not a constructor", "use layernorm, rmsnorm, batchnorm, groupnorm, linear, conv2d, embedding, or a shape like `[D, D]`"))
            }
        };
        args.done()?;
        Ok(Val::Group(group))
    }
}

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
