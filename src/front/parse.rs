//! Text to AST with pest; syntax errors become [`UserError`]s pointing at the offending text.

use super::ast::*;
use crate::diagnostic::UserError;
use crate::ir::{DType, Span};
use pest::iterators::Pair;
use pest::pratt_parser::{Assoc, Op as PrattOp, PrattParser};
use pest::Parser;
use pest_derive::Parser;

#[derive(Parser)]
#[grammar = "../grammar/mdl.pest"]
struct MdlParser;

fn span_of(p: &Pair<Rule>) -> Span {
    let s = p.as_span();
    Span::new(s.start(), s.end())
}

fn describe(rule: &Rule) -> String {
    match rule {
        Rule::EOI => "end of file".into(),
        Rule::ident => "a name".into(),
        Rule::expr => "an expression".into(),
        Rule::number => "a number".into(),
        Rule::tensor_type => "a tensor type like `[B, D]`".into(),
        Rule::targets => "a name".into(),
        Rule::model => "`model NAME { ... }`".into(),
        Rule::arg => "an argument".into(),
        Rule::add | Rule::sub | Rule::mul | Rule::div | Rule::matmul => "an operator".into(),
        Rule::dim_decl
        | Rule::input_decl
        | Rule::output_decl
        | Rule::param_decl
        | Rule::block_def
        | Rule::train => "a declaration".into(),
        Rule::let_stmt | Rule::assign_stmt | Rule::return_stmt => "a statement".into(),
        Rule::train_setting => "a setting like `optimizer = ...`".into(),
        Rule::frozen => "`frozen`".into(),
        other => format!("{other:?}").replace('_', " "),
    }
}

fn syntax_error(e: pest::error::Error<Rule>, len: usize) -> UserError {
    let (start, end) = match e.location {
        pest::error::InputLocation::Pos(p) if p >= len => (len.saturating_sub(1), len),
        pest::error::InputLocation::Pos(p) => (p, (p + 1).min(len)),
        pest::error::InputLocation::Span((a, b)) => (a, b),
    };
    let expected = match &e.variant {
        pest::error::ErrorVariant::ParsingError { positives, .. } if !positives.is_empty() => {
            let mut names: Vec<String> = positives.iter().map(describe).collect();
            names.sort();
            names.dedup();
            format!("expected {}", names.join(", "))
        }
        _ => "unexpected text".into(),
    };
    UserError::at(
        Span::new(start, end),
        format!("syntax error: {expected}"),
        "here",
        "see grammar/mdl.pest for the syntax; a statement is `let x = ...`, `x = ...` or `return ...`",
    )
}

/// Parses a whole `.mdl` file.
pub fn parse(text: &str) -> Result<Model, UserError> {
    if text.trim().is_empty() {
        return Err(UserError::general(
            "the file is empty",
            "a model file starts with `model NAME {`",
        ));
    }
    let mut pairs = MdlParser::parse(Rule::file, text).map_err(|e| syntax_error(e, text.len()))?;
    let model = pairs
        .next()
        .and_then(|f| f.into_inner().next())
        .ok_or_else(|| {
            UserError::general("no model found", "a model file starts with `model NAME {`")
        })?;
    Ok(Builder::new().model(model))
}

struct Builder {
    pratt: PrattParser<Rule>,
}

impl Builder {
    fn new() -> Builder {
        let pratt = PrattParser::new()
            .op(PrattOp::infix(Rule::add, Assoc::Left) | PrattOp::infix(Rule::sub, Assoc::Left))
            .op(PrattOp::infix(Rule::mul, Assoc::Left) | PrattOp::infix(Rule::div, Assoc::Left))
            .op(PrattOp::infix(Rule::matmul, Assoc::Left))
            .op(PrattOp::prefix(Rule::neg));
        Builder { pratt }
    }

    fn model(&self, p: Pair<Rule>) -> Model {
        let mut inner = p.into_inner();
        let name = inner.next().map(ident).unwrap_or_else(missing_ident);
        let items = inner.flat_map(|p| self.items(p)).collect();
        Model { name, items }
    }

    fn items(&self, p: Pair<Rule>) -> Vec<Item> {
        let span = span_of(&p);
        match p.as_rule() {
            Rule::dim_decl => p
                .into_inner()
                .map(|b| {
                    let mut it = b.into_inner();
                    let name = it.next().map(ident).unwrap_or_else(missing_ident);
                    Item::Dim(name, self.expr_opt(it.next(), span))
                })
                .collect(),
            Rule::input_decl => {
                let mut it = p.into_inner();
                let name = it.next().map(ident).unwrap_or_else(missing_ident);
                let ty = it.next().map(|t| self.type_expr(t)).unwrap_or(TypeExpr {
                    dtype: None,
                    dims: vec![],
                    span,
                });
                vec![Item::Input(name, ty)]
            }
            Rule::param_decl => vec![Item::Param(self.param(p))],
            Rule::output_decl => {
                let mut it = p.into_inner();
                let name = it.next().map(ident).unwrap_or_else(missing_ident);
                vec![Item::Output(name, self.expr_opt(it.next(), span))]
            }
            Rule::block_def => vec![Item::Block(self.block(p))],
            Rule::train => {
                let settings = p
                    .into_inner()
                    .map(|s| {
                        let s_span = span_of(&s);
                        let mut it = s.into_inner();
                        let name = it.next().map(ident).unwrap_or_else(missing_ident);
                        (name, self.expr_opt(it.next(), s_span))
                    })
                    .collect();
                vec![Item::Train(settings, span)]
            }
            _ => self.stmt(p).map(Item::Stmt).into_iter().collect(),
        }
    }

    fn param(&self, p: Pair<Rule>) -> ParamDecl {
        let span = span_of(&p);
        let frozen = p.clone().into_inner().any(|x| x.as_rule() == Rule::frozen);
        let mut it = p.into_inner().filter(|x| x.as_rule() != Rule::frozen);
        let name = it.next().map(ident).unwrap_or_else(missing_ident);
        let kind = match it.next() {
            Some(t) if t.as_rule() == Rule::param_tensor => {
                let mut t = t.into_inner();
                let ty = t.next().map(|x| self.type_expr(x)).unwrap_or(TypeExpr {
                    dtype: None,
                    dims: vec![],
                    span,
                });
                ParamKind::Tensor {
                    ty,
                    init: t.next().map(|e| self.expr(e)),
                }
            }
            Some(c) => ParamKind::Group(self.call(c)),
            None => ParamKind::Tensor {
                ty: TypeExpr {
                    dtype: None,
                    dims: vec![],
                    span,
                },
                init: None,
            },
        };
        ParamDecl {
            name,
            kind,
            frozen,
            span,
        }
    }

    fn block(&self, p: Pair<Rule>) -> BlockDef {
        let span = span_of(&p);
        let mut it = p.into_inner();
        let name = it.next().map(ident).unwrap_or_else(missing_ident);
        let mut args = Vec::new();
        let mut body = Vec::new();
        for q in it {
            match q.as_rule() {
                Rule::block_arg => {
                    let mut a = q.into_inner();
                    let n = a.next().map(ident).unwrap_or_else(missing_ident);
                    args.push((n, a.next().map(|t| self.type_expr(t))));
                }
                Rule::param_decl => body.push(BlockItem::Param(self.param(q))),
                _ => body.extend(self.stmt(q).map(BlockItem::Stmt)),
            }
        }
        BlockDef {
            name,
            args,
            body,
            span,
        }
    }

    fn stmt(&self, p: Pair<Rule>) -> Option<Stmt> {
        let span = span_of(&p);
        let rule = p.as_rule();
        let mut it = p.into_inner();
        match rule {
            Rule::return_stmt => Some(Stmt::Return(self.expr_opt(it.next(), span))),
            Rule::let_stmt | Rule::assign_stmt => {
                let targets = it
                    .next()
                    .map(|t| t.into_inner().map(ident).collect())
                    .unwrap_or_default();
                let value = self.expr_opt(it.next(), span);
                Some(if rule == Rule::let_stmt {
                    Stmt::Let(targets, value)
                } else {
                    Stmt::Assign(targets, value)
                })
            }
            _ => None,
        }
    }

    fn type_expr(&self, p: Pair<Rule>) -> TypeExpr {
        let span = span_of(&p);
        let mut dtype = None;
        let mut dims = Vec::new();
        for q in p.into_inner() {
            if q.as_rule() == Rule::dtype {
                dtype = DType::parse(q.as_str());
            } else {
                dims.push(self.expr(q));
            }
        }
        TypeExpr { dtype, dims, span }
    }

    fn expr_opt(&self, p: Option<Pair<Rule>>, span: Span) -> Expr {
        match p {
            Some(p) => self.expr(p),
            None => Expr {
                kind: ExprKind::Tuple(vec![]),
                span,
            },
        }
    }

    fn expr(&self, p: Pair<Rule>) -> Expr {
        self.pratt
            .map_primary(|q| self.primary(q))
            .map_prefix(|op, rhs| Expr {
                span: span_of(&op).join(rhs.span),
                kind: ExprKind::Neg(Box::new(rhs)),
            })
            .map_infix(|lhs, op, rhs| {
                let bin = match op.as_rule() {
                    Rule::add => BinOp::Add,
                    Rule::sub => BinOp::Sub,
                    Rule::mul => BinOp::Mul,
                    Rule::div => BinOp::Div,
                    _ => BinOp::MatMul,
                };
                Expr {
                    span: lhs.span.join(rhs.span),
                    kind: ExprKind::Binary(bin, Box::new(lhs), Box::new(rhs)),
                }
            })
            .parse(p.into_inner())
    }

    fn primary(&self, p: Pair<Rule>) -> Expr {
        let span = span_of(&p);
        let kind = match p.as_rule() {
            Rule::number => {
                let text = p.as_str();
                ExprKind::Number {
                    value: text.parse().unwrap_or(f64::NAN),
                    integral: !text.contains(['.', 'e', 'E']),
                }
            }
            Rule::size => {
                let mut it = p.into_inner();
                let n: f64 = it
                    .next()
                    .and_then(|n| n.as_str().parse().ok())
                    .unwrap_or(f64::NAN);
                let unit = match it.next().map(|u| u.as_str()) {
                    Some("KiB") => 1u64 << 10,
                    Some("MiB") => 1 << 20,
                    Some("GiB") => 1 << 30,
                    Some("TiB") => 1 << 40,
                    Some("KB") => 1_000,
                    Some("MB") => 1_000_000,
                    Some("GB") => 1_000_000_000,
                    Some("TB") => 1_000_000_000_000,
                    _ => 1,
                };
                ExprKind::Size((n * unit as f64).round() as u64)
            }
            Rule::path => ExprKind::Path(p.into_inner().map(ident).collect()),
            Rule::call => ExprKind::Call(self.call(p)),
            Rule::record => ExprKind::Record(
                p.into_inner()
                    .map(|f| {
                        let mut it = f.into_inner();
                        let name = it.next().map(ident);
                        let value = it.next().map(|e| self.expr(e)).unwrap_or(Expr {
                            kind: ExprKind::Tuple(vec![]),
                            span,
                        });
                        Arg { name, value }
                    })
                    .collect(),
            ),
            Rule::tuple => ExprKind::Tuple(p.into_inner().map(|e| self.expr(e)).collect()),
            Rule::paren => {
                return p.into_inner().next().map(|e| self.expr(e)).unwrap_or(Expr {
                    kind: ExprKind::Tuple(vec![]),
                    span,
                })
            }
            Rule::repeat => {
                let mut it = p.into_inner();
                let count = it.next().map(|c| self.primary(c)).unwrap_or(Expr {
                    kind: ExprKind::Tuple(vec![]),
                    span,
                });
                let blocks = match it.next() {
                    Some(c) if c.as_rule() == Rule::repeat_cycle => {
                        c.into_inner().map(ident).collect()
                    }
                    b => vec![b.map(ident).unwrap_or_else(missing_ident)],
                };
                let (named, args): (Vec<_>, Vec<_>) =
                    it.partition(|a| a.as_rule() == Rule::repeat_as);
                ExprKind::Repeat {
                    count: Box::new(count),
                    blocks,
                    args: args.into_iter().map(|a| self.arg(a)).collect(),
                    named_as: named
                        .into_iter()
                        .find_map(|a| a.into_inner().find(|q| q.as_rule() == Rule::param_name))
                        .map(ident),
                }
            }
            _ => ExprKind::Tuple(vec![]),
        };
        Expr { kind, span }
    }

    fn call(&self, p: Pair<Rule>) -> Call {
        let span = span_of(&p);
        let mut it = p.into_inner();
        let name = it.next().map(ident).unwrap_or_else(missing_ident);
        Call {
            name,
            args: it.map(|a| self.arg(a)).collect(),
            span,
        }
    }

    fn arg(&self, p: Pair<Rule>) -> Arg {
        let span = span_of(&p);
        let parts: Vec<Pair<Rule>> = p.into_inner().collect();
        let mut it = parts.into_iter();
        match (it.next(), it.next()) {
            (Some(n), Some(e)) => Arg {
                name: Some(ident(n)),
                value: self.expr(e),
            },
            (Some(e), None) => Arg {
                name: None,
                value: self.expr(e),
            },
            _ => Arg {
                name: None,
                value: Expr {
                    kind: ExprKind::Tuple(vec![]),
                    span,
                },
            },
        }
    }
}

fn ident(p: Pair<Rule>) -> Ident {
    Ident {
        name: p.as_str().to_string(),
        span: span_of(&p),
    }
}

fn missing_ident() -> Ident {
    Ident {
        name: String::new(),
        span: Span::default(),
    }
}
