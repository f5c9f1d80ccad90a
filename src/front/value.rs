//! Values the front end evaluates expressions to, before they become graph nodes.

use crate::ir::{Span, ValueId};

/// What a parameter constructor (`layernorm(D)`, `linear(I, O)`, ...) declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupKind {
    LayerNorm,
    RmsNorm,
    BatchNorm,
    GroupNorm(usize),
    /// `out_in`: the weight is stored `[O, I]`, as `torch.nn.Linear` keeps it, and read
    /// transposed by the matmul (no copy); otherwise `[I, O]`.
    Linear {
        out_in: bool,
    },
    /// A convolution of `rank` spatial axes (1 to 3), or its transpose.
    Conv {
        rank: usize,
        groups: usize,
        transposed: bool,
    },
    Embedding,
}

impl GroupKind {
    /// The constructor's surface name.
    pub fn name(self) -> &'static str {
        match self {
            GroupKind::LayerNorm => "layernorm",
            GroupKind::RmsNorm => "rmsnorm",
            GroupKind::BatchNorm => "batchnorm",
            GroupKind::GroupNorm(_) => "groupnorm",
            GroupKind::Linear { .. } => "linear",
            GroupKind::Conv {
                rank, transposed, ..
            } => {
                let names = if transposed {
                    ["conv_transpose1d", "conv_transpose2d", "conv_transpose3d"]
                } else {
                    ["conv1d", "conv2d", "conv3d"]
                };
                names[rank.clamp(1, 3) - 1]
            }
            GroupKind::Embedding => "embedding",
        }
    }
}

/// A parameter group: its kind and its tensors (`weight`, optionally `bias`, and a batch
/// norm's running mean and variance).
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub kind: GroupKind,
    pub weight: ValueId,
    pub bias: Option<ValueId>,
    pub running: Option<[ValueId; 2]>,
}

/// An evaluated expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    Int(i64),
    Float(f64),
    Size(u64),
    Tensor(ValueId),
    Tuple(Vec<Val>),
    /// A bare name that is not bound: `gelu`, `bf16`, `true`.
    Symbol(String),
    Group(Group),
}

impl Val {
    /// A short description for error messages.
    pub fn describe(&self) -> &'static str {
        match self {
            Val::Int(_) => "an integer",
            Val::Float(_) => "a number",
            Val::Size(_) => "a size",
            Val::Tensor(_) => "a tensor",
            Val::Tuple(_) => "a tuple",
            Val::Symbol(_) => "a name",
            Val::Group(_) => "a parameter group",
        }
    }

    /// The value as a float, when it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Val::Int(i) => Some(*i as f64),
            Val::Float(f) => Some(*f),
            _ => None,
        }
    }
}

/// A value with the span of the expression that produced it.
#[derive(Debug, Clone, PartialEq)]
pub struct Spanned {
    pub val: Val,
    pub span: Span,
}
