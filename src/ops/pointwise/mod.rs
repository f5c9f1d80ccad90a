//! Elementwise unary and binary functions and affine maps, with broadcasting.

mod backward;
mod cpu;
mod cuda;
mod rules;

use serde::{Deserialize, Serialize};

/// The pointwise family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}

/// Unary elementwise functions. `GeluTanh` is the tanh approximation (GPT-2), `GeluErf` exact;
/// `Erf` is the error function (ONNX `Erf`); `Softplus` is `log(1 + exp(x))` (ONNX
/// `Softplus`; `torch.nn.Softplus` with beta 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnaryFn {
    Neg,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Tanh,
    Sigmoid,
    Relu,
    GeluTanh,
    GeluErf,
    Silu,
    Erf,
    Softplus,
}

impl UnaryFn {
    /// Every unary function, in declaration order; a lookup of [`UnaryFn::name`] in this
    /// order finds `GeluTanh` for `gelu`.
    pub const ALL: &[UnaryFn] = &[
        UnaryFn::Neg,
        UnaryFn::Exp,
        UnaryFn::Log,
        UnaryFn::Sqrt,
        UnaryFn::Rsqrt,
        UnaryFn::Tanh,
        UnaryFn::Sigmoid,
        UnaryFn::Relu,
        UnaryFn::GeluTanh,
        UnaryFn::GeluErf,
        UnaryFn::Silu,
        UnaryFn::Erf,
        UnaryFn::Softplus,
    ];

    /// The `.mdl` function that computes it. Both gelus are `gelu`: the language writes
    /// `GeluErf` as `gelu(x, exact = true)`.
    pub fn name(self) -> &'static str {
        match self {
            UnaryFn::Neg => "neg",
            UnaryFn::Exp => "exp",
            UnaryFn::Log => "log",
            UnaryFn::Sqrt => "sqrt",
            UnaryFn::Rsqrt => "rsqrt",
            UnaryFn::Tanh => "tanh",
            UnaryFn::Sigmoid => "sigmoid",
            UnaryFn::Relu => "relu",
            UnaryFn::GeluTanh | UnaryFn::GeluErf => "gelu",
            UnaryFn::Silu => "silu",
            UnaryFn::Erf => "erf",
            UnaryFn::Softplus => "softplus",
        }
    }

    /// The ONNX op type that is exactly this function with no attributes, or None where no
    /// ONNX op is (`Rsqrt`, `Silu`; ONNX `Gelu` picks a gelu by its `approximate`
    /// attribute, so neither gelu has one).
    pub fn onnx_name(self) -> Option<&'static str> {
        match self {
            UnaryFn::Neg => Some("Neg"),
            UnaryFn::Exp => Some("Exp"),
            UnaryFn::Log => Some("Log"),
            UnaryFn::Sqrt => Some("Sqrt"),
            UnaryFn::Tanh => Some("Tanh"),
            UnaryFn::Sigmoid => Some("Sigmoid"),
            UnaryFn::Relu => Some("Relu"),
            UnaryFn::Erf => Some("Erf"),
            UnaryFn::Softplus => Some("Softplus"),
            UnaryFn::Rsqrt | UnaryFn::Silu | UnaryFn::GeluTanh | UnaryFn::GeluErf => None,
        }
    }
}

impl UnaryFn {
    /// Whether `f'(x)` is a function of the output `y = f(x)` alone (`exp`: y; `tanh`:
    /// 1 - y²; `sigmoid`: y(1 - y); `relu`: 1 where y > 0), so a backward op may read the
    /// output instead of the input ([`crate::ir::Op::UnaryOutputBackward`]). The kernels
    /// compute `f'(x)` for these functions as this function of `f(x)`, so both forms give
    /// bitwise the same gradient when `y` is stored at the precision it was computed in.
    pub fn derivative_from_output(self) -> bool {
        matches!(
            self,
            UnaryFn::Exp | UnaryFn::Tanh | UnaryFn::Sigmoid | UnaryFn::Relu
        )
    }
}

/// Binary elementwise functions with numpy broadcasting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BinaryFn {
    Add,
    Sub,
    Mul,
    Div,
}

#[cfg(test)]
mod tests {
    use super::UnaryFn;

    #[test]
    fn unary_tables_agree() {
        let mut seen = std::collections::HashSet::new();
        assert!(UnaryFn::ALL.iter().all(|f| seen.insert(*f)));
        assert_eq!(UnaryFn::ALL.len(), 13);
        for f in UnaryFn::ALL {
            if let Some(onnx) = f.onnx_name() {
                assert_eq!(onnx.to_lowercase(), f.name());
            }
        }
        let gelu = UnaryFn::ALL.iter().find(|f| f.name() == "gelu");
        assert_eq!(gelu, Some(&UnaryFn::GeluTanh));
    }
}
