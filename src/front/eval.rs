//! Expression evaluation: numbers, tuples, names and fields, arithmetic on numbers and
//! tensors, calls and `repeat`.

use super::ast::*;
use super::lower::{unknown_name, Env, Lowerer, R};
use super::value::{Group, Spanned, Val};
use crate::diagnostic::UserError;
use crate::ir::{DType, Op, Span};

impl Lowerer<'_> {
    /// Evaluates an expression in `env`.
    pub(super) fn eval(&mut self, e: &Expr, env: &Env) -> R<Spanned> {
        let val =
            match &e.kind {
                ExprKind::Number { value, integral } => {
                    if *integral && value.abs() < 9.0e15 {
                        Val::Int(*value as i64)
                    } else {
                        Val::Float(*value)
                    }
                }
                ExprKind::Size(b) => Val::Size(*b),
                ExprKind::Tuple(items) => {
                    let mut vals = Vec::new();
                    for i in items {
                        vals.push(self.eval(i, env)?.val);
                    }
                    Val::Tuple(vals)
                }
                ExprKind::Record(_) => return Err(UserError::at(
                    e.span,
                    "named settings `(key = value, ...)` are not a value",
                    "settings",
                    "they are written only in `train { }`, e.g. `parallel = (data = 8, zero = 1)`",
                )),
                ExprKind::Path(parts) => self.path(parts, env)?,
                ExprKind::Neg(inner) => {
                    let v = self.eval(inner, env)?;
                    match v.val {
                        Val::Int(i) => Val::Int(-i),
                        Val::Float(f) => Val::Float(-f),
                        Val::Tensor(t) => Val::Tensor(self.add(
                            Op::Unary(crate::ir::UnaryFn::Neg),
                            vec![t],
                            e.span,
                        )?),
                        other => {
                            return Err(UserError::at(
                                e.span,
                                format!("cannot negate {}", other.describe()),
                                "here",
                                "negate a number or a tensor",
                            ))
                        }
                    }
                }
                ExprKind::Binary(op, a, b) => {
                    let a = self.eval(a, env)?;
                    let b = self.eval(b, env)?;
                    self.binary(*op, a, b, e.span)?
                }
                ExprKind::Call(call) => return self.call(call, env),
                ExprKind::Repeat {
                    count,
                    blocks,
                    args,
                    named_as,
                } => return self.repeat(count, blocks, args, named_as.as_ref(), env, e.span),
            };
        Ok(Spanned { val, span: e.span })
    }

    fn path(&mut self, parts: &[Ident], env: &Env) -> R<Val> {
        let Some(first) = parts.first() else {
            return Ok(Val::Tuple(vec![]));
        };
        // A dotted parameter name (`self_attn.q_proj`) is bound whole: the longest bound
        // prefix of the path is the value, the rest its fields.
        let bound = (1..=parts.len()).rev().find_map(|n| {
            let name: Vec<&str> = parts[..n].iter().map(|p| p.name.as_str()).collect();
            env.get(&name.join(".")).map(|v| (n, v))
        });
        let Some((taken, base)) = bound else {
            if parts.len() == 1 {
                return Ok(Val::Symbol(first.name.clone()));
            }
            return Err(UserError::at(
                first.span,
                format!("unknown name `{}`", first.name),
                "not defined",
                "declare it with `let`, `param`, `input` or `dim`",
            ));
        };
        let mut val = base.val.clone();
        for field in &parts[taken..] {
            val = match (&val, field.name.as_str()) {
                (Val::Group(g), "weight") => Val::Tensor(g.weight),
                (Val::Group(Group { bias: Some(b), .. }), "bias") => Val::Tensor(*b),
                (Val::Group(Group { running: Some(r), .. }), "running_mean") => Val::Tensor(r[0]),
                (Val::Group(Group { running: Some(r), .. }), "running_var") => Val::Tensor(r[1]),
                _ => {
                    return Err(UserError::at(
                        field.span,
                        format!("no field `{}` on {}", field.name, val.describe()),
                        "unknown field",
                        "parameter groups have `weight` and (when declared) `bias`; batch norms also `running_mean` and `running_var`",
                    ))
                }
            };
        }
        Ok(val)
    }

    fn binary(&mut self, op: BinOp, a: Spanned, b: Spanned, span: Span) -> R<Val> {
        use crate::ir::BinaryFn;
        match (&a.val, &b.val) {
            (Val::Int(x), Val::Int(y)) => {
                let r = match op {
                    BinOp::Add => x.checked_add(*y),
                    BinOp::Sub => x.checked_sub(*y),
                    BinOp::Mul => x.checked_mul(*y),
                    BinOp::Div if *y == 0 => {
                        return Err(UserError::at(
                            b.span,
                            "division by zero",
                            "zero",
                            "check the dims",
                        ))
                    }
                    BinOp::Div if x % y != 0 => return Ok(Val::Float(*x as f64 / *y as f64)),
                    BinOp::Div => Some(x / y),
                    BinOp::MatMul => {
                        return Err(UserError::at(
                            span,
                            "`@` needs tensors, got integers",
                            "here",
                            "use `*` for numbers",
                        ))
                    }
                };
                r.map(Val::Int).ok_or_else(|| {
                    UserError::at(span, "integer overflow", "too large", "use smaller dims")
                })
            }
            (Val::Tensor(x), Val::Tensor(y)) => {
                let op = match op {
                    BinOp::Add => Op::Binary(BinaryFn::Add),
                    BinOp::Sub => Op::Binary(BinaryFn::Sub),
                    BinOp::Mul => Op::Binary(BinaryFn::Mul),
                    BinOp::Div => Op::Binary(BinaryFn::Div),
                    BinOp::MatMul => Op::matmul(false, false),
                };
                Ok(Val::Tensor(self.add(op, vec![*x, *y], span)?))
            }
            (Val::Tensor(t), n) | (n, Val::Tensor(t)) if n.as_f64().is_some() => {
                let c = n.as_f64().unwrap_or(0.0) as f32;
                let tensor_left = matches!(a.val, Val::Tensor(_));
                let (scale, shift) = match (op, tensor_left) {
                    (BinOp::Add, _) => (1.0, c),
                    (BinOp::Mul, _) => (c, 0.0),
                    (BinOp::Sub, true) => (1.0, -c),
                    (BinOp::Sub, false) => (-1.0, c),
                    (BinOp::Div, true) if c != 0.0 => (1.0 / c, 0.0),
                    _ => return Err(UserError::at(span, "this operation between a number and a tensor is not supported", "here", "numbers can be added, subtracted, multiplied, and divide a tensor by a nonzero number")),
                };
                Ok(Val::Tensor(self.add(
                    Op::Affine { scale, shift },
                    vec![*t],
                    span,
                )?))
            }
            (x, y) if x.as_f64().is_some() && y.as_f64().is_some() => {
                let (x, y) = (x.as_f64().unwrap_or(0.0), y.as_f64().unwrap_or(0.0));
                Ok(Val::Float(match op {
                    BinOp::Add => x + y,
                    BinOp::Sub => x - y,
                    BinOp::Mul => x * y,
                    BinOp::Div => x / y,
                    BinOp::MatMul => {
                        return Err(UserError::at(
                            span,
                            "`@` needs tensors",
                            "here",
                            "use `*` for numbers",
                        ))
                    }
                }))
            }
            (Val::Symbol(name), _) => Err(unknown_name(name, a.span)),
            (_, Val::Symbol(name)) => Err(unknown_name(name, b.span)),
            (x, y) => Err(UserError::at(
                span,
                format!("cannot combine {} and {}", x.describe(), y.describe()),
                "here",
                "arithmetic works on numbers and tensors",
            )),
        }
    }

    fn repeat(
        &mut self,
        count: &Expr,
        blocks: &[Ident],
        args: &[Arg],
        named_as: Option<&Ident>,
        env: &Env,
        span: Span,
    ) -> R<Spanned> {
        let n = self.eval(count, env)?;
        let n = self.dim(&n, "a repeat count")?;
        let mut defs = Vec::new();
        for block in blocks {
            let Some(def) = self.block(&block.name) else {
                return Err(UserError::at(
                    block.span,
                    format!("unknown block `{}`", block.name),
                    "not a block",
                    "define it with `block name(x) { ... }`",
                ));
            };
            defs.push(def);
        }
        if let Some(&first) = defs.first() {
            for (block, &def) in blocks.iter().zip(&defs).skip(1) {
                self.same_signature(first, def, block.span)?;
            }
        }
        let mut vals = Vec::new();
        for a in args {
            if let Some(name) = &a.name {
                return Err(UserError::at(
                    name.span,
                    "blocks take positional arguments",
                    "keyword",
                    "pass arguments in order",
                ));
            }
            vals.push(self.eval(&a.value, env)?);
        }
        if vals.is_empty() {
            return Err(UserError::at(
                span,
                "`repeat` needs the value to carry through the copies",
                "no argument",
                "write `repeat L layer(x)`",
            ));
        }
        for def in defs.iter().cycle().take(n) {
            let out = self.instantiate(def, vals.clone(), named_as, span)?;
            vals[0] = Spanned { val: out.val, span };
        }
        Ok(vals.swap_remove(0))
    }

    /// Checks that block `def`, written at `at` in a `repeat` cycle, takes the arguments
    /// `first` takes: as many, each untyped in both or of the same declared type.
    fn same_signature(&mut self, first: &BlockDef, def: &BlockDef, at: Span) -> R<()> {
        let mismatch = |what: String| {
            UserError::at(
                at,
                format!(
                    "the blocks a `repeat` cycles through must take the same arguments: `{}` {what}",
                    def.name.name
                ),
                "different signature",
                format!(
                    "give `{}` the arguments of `{}`, in the same order and of the same types",
                    def.name.name, first.name.name
                ),
            )
        };
        if def.args.len() != first.args.len() {
            return Err(mismatch(format!(
                "takes {} argument(s), `{}` {}",
                def.args.len(),
                first.name.name,
                first.args.len()
            )));
        }
        let globals = self.globals.clone();
        for ((name, a), (_, b)) in def.args.iter().zip(&first.args) {
            let same = match (a, b) {
                (None, None) => true,
                (Some(a), Some(b)) => {
                    self.tensor_type(a, &globals, DType::F32)?
                        == self.tensor_type(b, &globals, DType::F32)?
                }
                _ => false,
            };
            if !same {
                return Err(mismatch(format!(
                    "types argument `{}` differently from `{}`",
                    name.name, first.name.name
                )));
            }
        }
        Ok(())
    }
}
