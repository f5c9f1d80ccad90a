//! AST to graph: resolves dims, expands blocks and `repeat`, creates parameters, and turns
//! every expression into graph nodes with inferred shapes; sugar lowers to core ops here.

use super::ast::*;
use super::train::{train_spec, TrainSpec};
use super::value::{Group, Spanned, Val};
use crate::diagnostic::UserError;
use crate::ir::{DType, Graph, Init, Op, Origin, Phase, Span, TensorType, TypeError, ValueId};
use std::collections::HashMap;

/// The front end's result: the forward graph and how to train it.
#[derive(Debug, Clone)]
pub struct Module {
    pub name: String,
    pub graph: Graph,
    pub train: Option<TrainSpec>,
    /// Final dim values after `--set` overrides, in declaration order.
    pub dims: Vec<(String, i64)>,
}

pub(super) type Env = HashMap<String, Spanned>;

/// The lowering state: the graph under construction and the name environments.
pub(super) struct Lowerer<'a> {
    pub(super) graph: Graph,
    pub(super) globals: Env,
    blocks: HashMap<String, &'a BlockDef>,
    instances: HashMap<String, usize>,
    /// Dotted scope of the block instance being expanded (`layer.3`, the block's name and
    /// its instance number); empty at top level. Passes read block instances from it.
    pub(super) scope: String,
    /// The prefix parameters are named under: the scope, except below a `repeat ... as P`,
    /// whose copies name theirs `P.0`, `P.1`, ...
    prefix: String,
    /// Copies made so far under each `as` prefix.
    named_copies: HashMap<String, usize>,
    pub(super) next_seed: u64,
    /// The model has a `train { }` block; without one the step is inference, where
    /// dropout is the identity (eval mode).
    pub(super) training: bool,
    /// The parameter declaration being lowered is `frozen`.
    freezing: bool,
    param_names: HashMap<String, Span>,
    depth: usize,
}

pub(super) type R<T> = Result<T, UserError>;

/// `name` under `prefix` (`prefix.name`, or `name` when the prefix is empty).
fn dotted(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

/// The diagnostic for a bare name that is bound to nothing.
/// The diagnostic for a name nothing declares.
pub(super) fn unknown_name(name: &str, span: Span) -> UserError {
    UserError::at(
        span,
        format!("unknown name `{name}`"),
        "not defined",
        "declare it with `let`, `param`, `input` or `dim` before use",
    )
}

/// What the top level of a model has declared so far.
#[derive(Default)]
struct TopLevel {
    globals: Env,
    dims: Vec<(String, i64)>,
    train: Option<TrainSpec>,
    loss: Option<(ValueId, Span)>,
}

/// Lowers a parsed model, applying `overrides` (from `--set`) to its dims; where a dim is
/// overridden more than once, the last value wins.
pub fn lower(model: &Model, overrides: &[(String, i64)]) -> R<Module> {
    let mut l = Lowerer {
        graph: Graph::new(),
        globals: Env::new(),
        blocks: HashMap::new(),
        instances: HashMap::new(),
        scope: String::new(),
        prefix: String::new(),
        named_copies: HashMap::new(),
        next_seed: 1,
        training: model
            .items
            .iter()
            .any(|item| matches!(item, Item::Train(..))),
        freezing: false,
        param_names: HashMap::new(),
        depth: 0,
    };
    let mut top = TopLevel::default();
    for item in &model.items {
        l.item(item, &mut top, overrides)?;
        l.globals = top.globals.clone();
    }
    l.finish(model, top, overrides)
}

impl<'a> Lowerer<'a> {
    /// Lowers one top-level item, recording what it declares in `top`.
    fn item(&mut self, item: &'a Item, top: &mut TopLevel, overrides: &[(String, i64)]) -> R<()> {
        match item {
            Item::Dim(name, expr) => self.dim_item(name, expr, top, overrides)?,
            Item::Input(name, ty) => {
                let ty = self.tensor_type(ty, &top.globals, DType::F32)?;
                let id = self.add(
                    Op::Input {
                        name: name.name.clone(),
                        ty,
                    },
                    vec![],
                    name.span,
                )?;
                self.bind(&mut top.globals, name, Val::Tensor(id))?;
            }
            Item::Param(decl) => {
                let v = self.param(decl, &top.globals)?;
                self.bind(&mut top.globals, &decl.name, v)?;
            }
            Item::Block(def) => {
                if self.blocks.insert(def.name.name.clone(), def).is_some() {
                    return Err(UserError::at(
                        def.name.span,
                        format!("block `{}` is defined twice", def.name.name),
                        "second definition",
                        "rename one of the blocks",
                    ));
                }
            }
            Item::Train(settings, span) => {
                if top.train.is_some() {
                    return Err(UserError::at(
                        *span,
                        "a second `train` section",
                        "duplicate",
                        "merge the settings into one `train { }`",
                    ));
                }
                top.train = Some(train_spec(settings, *span)?);
            }
            Item::Output(name, expr) => {
                let v = self.eval(expr, &top.globals)?;
                let id = self.tensor(&v, "an output")?;
                self.graph.outputs.push((name.name.clone(), id));
            }
            Item::Stmt(Stmt::Assign(targets, expr))
                if targets.len() == 1
                    && targets[0].name == "loss"
                    && !top.globals.contains_key("loss") =>
            {
                let v = self.eval(expr, &top.globals)?;
                let id = self.tensor(&v, "the loss")?;
                top.loss = Some((id, expr.span));
            }
            Item::Stmt(stmt) => {
                self.globals = top.globals.clone();
                if let Some(ret) = self.stmt(stmt, &mut top.globals)? {
                    return Err(UserError::at(
                        ret.span,
                        "`return` outside a block",
                        "here",
                        "use `loss = ...` or `output name = ...` at top level",
                    ));
                }
            }
        }
        Ok(())
    }

    /// `dim NAME = expr`, or the value `--set` gives it.
    fn dim_item(
        &mut self,
        name: &Ident,
        expr: &Expr,
        top: &mut TopLevel,
        overrides: &[(String, i64)],
    ) -> R<()> {
        let value = self.eval(expr, &top.globals)?;
        let mut v = self.int(&value, "a dim")?;
        if let Some((_, o)) = overrides.iter().rev().find(|(n, _)| *n == name.name) {
            v = *o;
        }
        if v <= 0 {
            return Err(UserError::at(
                expr.span,
                format!("dim {} = {v} must be a positive integer", name.name),
                "not positive",
                "dims are sizes: give a value of at least 1",
            ));
        }
        top.dims.push((name.name.clone(), v));
        self.bind(&mut top.globals, name, Val::Int(v))?;
        Ok(())
    }

    /// Checks the model as a whole (overrides, loss, outputs) and returns the module.
    fn finish(mut self, model: &Model, top: TopLevel, overrides: &[(String, i64)]) -> R<Module> {
        if let Some((name, _)) = overrides
            .iter()
            .find(|(n, _)| !top.dims.iter().any(|(d, _)| d == n))
        {
            let known: Vec<&str> = top.dims.iter().map(|(d, _)| d.as_str()).collect();
            return Err(UserError::general(
                format!("`--set {name}=...` names no dim of this model"),
                format!("the model's dims are: {}", known.join(", ")),
            ));
        }
        if let Some((id, span)) = top.loss {
            let ty = &self.graph.node(id).ty;
            if !ty.shape.is_empty() {
                return Err(UserError::at(
                    span,
                    format!("the loss must be a scalar, got {ty}"),
                    "not a scalar",
                    "reduce it, e.g. `loss = mean(...)`",
                ));
            }
            self.graph.outputs.insert(0, ("loss".into(), id));
        }
        if let Some(t) = &top.train {
            if top.loss.is_none() {
                return Err(UserError::at(
                    t.span,
                    "a model with `train` needs a loss",
                    "training needs a loss",
                    "add `loss = cross_entropy(logits, targets)` or similar",
                ));
            }
        }
        if self.graph.outputs.is_empty() {
            return Err(UserError::at(
                model.name.span,
                "the model computes nothing",
                "no outputs",
                "assign `loss = ...` or declare `output name = ...`",
            ));
        }
        Ok(Module {
            name: model.name.name.clone(),
            graph: self.graph,
            train: top.train,
            dims: top.dims,
        })
    }

    fn bind(&mut self, env: &mut Env, name: &Ident, val: Val) -> R<()> {
        if self.blocks.contains_key(&name.name) {
            return Err(UserError::at(
                name.span,
                format!("`{}` is already a block", name.name),
                "name taken",
                "choose another name",
            ));
        }
        env.insert(
            name.name.clone(),
            Spanned {
                val,
                span: name.span,
            },
        );
        Ok(())
    }

    /// Appends a node, turning a type error into a diagnostic at `span`.
    pub(super) fn add(&mut self, op: Op, inputs: Vec<ValueId>, span: Span) -> R<ValueId> {
        let origin = Origin {
            span,
            scope: self.scope.clone(),
            phase: Phase::Forward,
        };
        self.graph
            .add(op, inputs, &origin)
            .map_err(|e: TypeError| UserError::at(span, e.message, "in this expression", e.help))
    }

    pub(super) fn ty(&self, v: ValueId) -> &TensorType {
        &self.graph.node(v).ty
    }

    pub(super) fn int(&self, v: &Spanned, what: &str) -> R<i64> {
        match v.val {
            Val::Int(i) => Ok(i),
            Val::Float(f) => Err(UserError::at(
                v.span,
                format!("{what} must be a whole number, got {f}"),
                "not whole",
                "check divisions: `D/H` must divide exactly",
            )),
            ref other => Err(UserError::at(
                v.span,
                format!("{what} must be an integer, got {}", other.describe()),
                "not an integer",
                "use a dim or an integer literal",
            )),
        }
    }

    pub(super) fn dim(&self, v: &Spanned, what: &str) -> R<usize> {
        let i = self.int(v, what)?;
        if i <= 0 {
            return Err(UserError::at(
                v.span,
                format!("{what} must be positive, got {i}"),
                "not positive",
                "sizes are at least 1",
            ));
        }
        Ok(i as usize)
    }

    pub(super) fn float(&self, v: &Spanned, what: &str) -> R<f64> {
        v.val.as_f64().ok_or_else(|| {
            UserError::at(
                v.span,
                format!("{what} must be a number, got {}", v.val.describe()),
                "not a number",
                "write a literal like 0.1",
            )
        })
    }

    pub(super) fn tensor(&self, v: &Spanned, what: &str) -> R<ValueId> {
        match &v.val {
            Val::Tensor(id) => Ok(*id),
            Val::Symbol(name) => Err(unknown_name(name, v.span)),
            other => Err(UserError::at(
                v.span,
                format!("{what} must be a tensor, got {}", other.describe()),
                "not a tensor",
                "pass a tensor value here",
            )),
        }
    }

    pub(super) fn group(&self, v: &Spanned, what: &str) -> R<Group> {
        match &v.val {
            Val::Group(g) => Ok(g.clone()),
            Val::Symbol(name) => Err(unknown_name(name, v.span)),
            other => Err(UserError::at(
                v.span,
                format!("{what} must be a parameter group, got {}", other.describe()),
                "not a parameter group",
                "declare it as e.g. `param ln: layernorm(D)`",
            )),
        }
    }

    pub(super) fn tensor_type(&mut self, t: &TypeExpr, env: &Env, default: DType) -> R<TensorType> {
        let mut shape = Vec::new();
        for d in &t.dims {
            let v = self.eval(d, env)?;
            shape.push(self.dim(&v, "a tensor dim")?);
        }
        Ok(TensorType::new(t.dtype.unwrap_or(default), shape))
    }

    /// Creates a parameter tensor named under the current prefix.
    pub(super) fn new_param(&mut self, name: &Ident, ty: TensorType, init: Init) -> R<ValueId> {
        self.new_state(name, ty, init, false)
    }

    /// A persistent tensor named `name` (dotted after the block prefix): a parameter, or with
    /// `buffer` model state that is not one (frozen, see [`Op::Param`]).
    pub(super) fn new_state(
        &mut self,
        name: &Ident,
        ty: TensorType,
        init: Init,
        buffer: bool,
    ) -> R<ValueId> {
        let full = dotted(&self.prefix, &name.name);
        if self.param_names.insert(full.clone(), name.span).is_some() {
            return Err(UserError::at(
                name.span,
                format!("parameter `{full}` is declared twice"),
                "second declaration",
                "give each parameter its own name",
            ));
        }
        self.add(
            Op::Param {
                name: full,
                ty,
                init,
                frozen: self.freezing || buffer,
                buffer,
            },
            vec![],
            name.span,
        )
    }

    fn init(&mut self, e: &Expr, env: &Env) -> R<Init> {
        let (name, args): (&str, Vec<&Expr>) = match &e.kind {
            ExprKind::Path(p) if p.len() == 1 => (p[0].name.as_str(), vec![]),
            ExprKind::Call(c) => (
                c.name.name.as_str(),
                c.args.iter().map(|a| &a.value).collect(),
            ),
            _ => ("", vec![]),
        };
        let mut nums = Vec::new();
        for a in &args {
            let v = self.eval(a, env)?;
            nums.push(self.float(&v, "an initializer argument")? as f32);
        }
        match (name, nums.as_slice()) {
            ("normal", [std]) if *std >= 0.0 => Ok(Init::Normal { std: *std }),
            ("uniform", [a, b]) if a <= b => Ok(Init::Uniform { low: *a, high: *b }),
            ("zeros", []) => Ok(Init::Zeros),
            ("ones", []) => Ok(Init::Ones),
            _ => Err(UserError::at(
                e.span,
                "unknown or malformed initializer",
                "not an initializer",
                "use normal(std), uniform(low, high), zeros or ones",
            )),
        }
    }

    fn param(&mut self, decl: &ParamDecl, env: &Env) -> R<Val> {
        self.freezing = decl.frozen;
        let value = self.param_kind(decl, env);
        self.freezing = false;
        value
    }

    fn param_kind(&mut self, decl: &ParamDecl, env: &Env) -> R<Val> {
        match &decl.kind {
            ParamKind::Tensor { ty, init } => {
                let ty = self.tensor_type(ty, env, DType::F32)?;
                if !ty.dtype.is_float() {
                    return Err(UserError::at(
                        decl.span,
                        format!("parameter `{}` must be floating, got {ty}", decl.name.name),
                        "integer parameter",
                        "parameters are f32 (precision is chosen in `train`)",
                    ));
                }
                let init = match init {
                    Some(e) => self.init(e, env)?,
                    None => Init::Normal { std: 0.02 },
                };
                Ok(Val::Tensor(self.new_param(&decl.name, ty, init)?))
            }
            ParamKind::Group(call) => self.param_group(&decl.name, call, env),
        }
    }

    /// Evaluates the statements of a block or the top level; returns the value of `return`.
    fn stmt(&mut self, stmt: &Stmt, env: &mut Env) -> R<Option<Spanned>> {
        match stmt {
            Stmt::Return(e) => Ok(Some(self.eval(e, env)?)),
            Stmt::Let(targets, e) | Stmt::Assign(targets, e) => {
                let v = self.eval(e, env)?;
                let vals = if targets.len() == 1 {
                    vec![v.val]
                } else {
                    match v.val {
                        Val::Tuple(items) if items.len() == targets.len() => items,
                        other => {
                            let n = if let Val::Tuple(items) = &other {
                                items.len()
                            } else {
                                1
                            };
                            return Err(UserError::at(e.span, format!("cannot unpack {n} value(s) into {} names", targets.len()), "wrong count", "match the number of names to the values, e.g. `split(x, 3)` gives 3"));
                        }
                    }
                };
                for (t, val) in targets.iter().zip(vals) {
                    let is_assign = matches!(stmt, Stmt::Assign(..));
                    if is_assign && !env.contains_key(&t.name) {
                        return Err(UserError::at(
                            t.span,
                            format!("`{}` is not defined", t.name),
                            "assigned before definition",
                            format!("introduce it with `let {} = ...`", t.name),
                        ));
                    }
                    self.bind(env, t, val)?;
                }
                Ok(None)
            }
        }
    }

    /// Expands one instance of block `def` with `args`, returning its result; `named_as` is
    /// the `as` prefix of a `repeat`, under which this copy names its parameters.
    pub(super) fn instantiate(
        &mut self,
        def: &BlockDef,
        args: Vec<Spanned>,
        named_as: Option<&Ident>,
        call_span: Span,
    ) -> R<Spanned> {
        if args.len() != def.args.len() {
            return Err(UserError::at(
                call_span,
                format!(
                    "block `{}` takes {} argument(s), got {}",
                    def.name.name,
                    def.args.len(),
                    args.len()
                ),
                "wrong arity",
                format!("see the definition of `{}`", def.name.name),
            ));
        }
        if self.depth > 32 {
            return Err(UserError::at(
                call_span,
                "blocks nest too deeply (recursion?)",
                "here",
                "a block cannot call itself",
            ));
        }
        let key = dotted(&self.scope, &def.name.name);
        let index = self.instances.entry(key.clone()).or_insert(0);
        let scope = format!("{key}.{index}");
        *index += 1;
        let naming = match named_as {
            Some(p) => dotted(&self.prefix, &p.name),
            None => dotted(&self.prefix, &def.name.name),
        };
        let copy = self.named_copies.entry(naming.clone()).or_insert(0);
        let prefix = format!("{naming}.{copy}");
        *copy += 1;
        let mut env = self.globals.clone();
        for ((name, ty), arg) in def.args.iter().zip(args) {
            if let Some(ty) = ty {
                let want = self.tensor_type(ty, &self.globals.clone(), DType::F32)?;
                let id = self.tensor(&arg, &format!("argument `{}`", name.name))?;
                let got = self.ty(id);
                if got.shape != want.shape {
                    return Err(UserError::at(
                        arg.span,
                        format!(
                            "shape mismatch: block `{}` expects `{}` as {want}, got {got}",
                            def.name.name, name.name
                        ),
                        "wrong shape",
                        "pass a tensor of the declared shape",
                    ));
                }
            }
            env.insert(name.name.clone(), arg);
        }
        let saved = std::mem::replace(&mut self.scope, scope);
        let saved_prefix = std::mem::replace(&mut self.prefix, prefix);
        self.depth += 1;
        let mut result = None;
        for item in &def.body {
            let r = match item {
                BlockItem::Param(decl) => {
                    let v = self.param(decl, &env)?;
                    self.bind(&mut env, &decl.name, v)?;
                    None
                }
                BlockItem::Stmt(s) => self.stmt(s, &mut env)?,
            };
            if r.is_some() {
                result = r;
                break;
            }
        }
        self.depth -= 1;
        self.scope = saved;
        self.prefix = saved_prefix;
        result.ok_or_else(|| {
            UserError::at(
                def.span,
                format!("block `{}` does not return a value", def.name.name),
                "no return",
                "end the block with `return x`",
            )
        })
    }

    pub(super) fn block(&self, name: &str) -> Option<&'a BlockDef> {
        self.blocks.get(name).copied()
    }
}
