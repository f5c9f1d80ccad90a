//! The syntax tree of a `.mdl` file, every node with its source span.

use crate::ir::{DType, Span};

/// A name with where it was written.
#[derive(Debug, Clone, PartialEq)]
pub struct Ident {
    pub name: String,
    pub span: Span,
}

/// A whole `model NAME { ... }`.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    pub name: Ident,
    pub items: Vec<Item>,
}

/// A top-level item, in source order.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Dim(Ident, Expr),
    Input(Ident, TypeExpr),
    Param(ParamDecl),
    Block(BlockDef),
    Train(Vec<(Ident, Expr)>, Span),
    Output(Ident, Expr),
    Stmt(Stmt),
}

/// `dtype? [dims]`.
#[derive(Debug, Clone, PartialEq)]
pub struct TypeExpr {
    pub dtype: Option<DType>,
    pub dims: Vec<Expr>,
    pub span: Span,
}

/// `param NAME: [dims] = init` or `param NAME: constructor(args)`.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamDecl {
    pub name: Ident,
    pub kind: ParamKind,
    /// Declared `frozen`: loaded and read, never trained (no gradient, no optimizer state).
    pub frozen: bool,
    pub span: Span,
}

/// The two forms of parameter declaration.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamKind {
    Tensor { ty: TypeExpr, init: Option<Expr> },
    Group(Call),
}

/// `block NAME(args) { params and statements }`.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockDef {
    pub name: Ident,
    pub args: Vec<(Ident, Option<TypeExpr>)>,
    pub body: Vec<BlockItem>,
    pub span: Span,
}

/// A statement or parameter inside a block.
#[derive(Debug, Clone, PartialEq)]
pub enum BlockItem {
    Param(ParamDecl),
    Stmt(Stmt),
}

/// A statement.
#[derive(Debug, Clone, PartialEq)]
pub enum Stmt {
    Let(Vec<Ident>, Expr),
    Assign(Vec<Ident>, Expr),
    Return(Expr),
}

/// An expression with its span.
#[derive(Debug, Clone, PartialEq)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

/// Binary operators of the surface language.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    MatMul,
}

/// Expression forms.
#[derive(Debug, Clone, PartialEq)]
pub enum ExprKind {
    /// A number; `integral` when written without a fraction or exponent.
    Number {
        value: f64,
        integral: bool,
    },
    /// A byte size such as `16GiB`.
    Size(u64),
    /// `a` or `a.b.c`.
    Path(Vec<Ident>),
    Call(Call),
    Repeat {
        count: Box<Expr>,
        /// The block each copy expands: copy `i` expands `blocks[i % blocks.len()]` (one block,
        /// or the cycle of `repeat N (a, b)(x)`).
        blocks: Vec<Ident>,
        args: Vec<Arg>,
        /// `as P`: the copies name their parameters `P.0.<name>`, `P.1.<name>`, ...
        named_as: Option<Ident>,
    },
    Tuple(Vec<Expr>),
    /// `(name = value, ...)`: named settings (every argument has its name).
    Record(Vec<Arg>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    Neg(Box<Expr>),
}

/// `name(args)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub name: Ident,
    pub args: Vec<Arg>,
    pub span: Span,
}

/// A positional or keyword argument.
#[derive(Debug, Clone, PartialEq)]
pub struct Arg {
    pub name: Option<Ident>,
    pub value: Expr,
}
