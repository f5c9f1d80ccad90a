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
/// `Softplus`; `torch.nn.Softplus` with beta 1); `Reciprocal` is `1 / x`.
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
    Reciprocal,
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
        UnaryFn::Reciprocal,
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
            UnaryFn::Reciprocal => "reciprocal",
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
            UnaryFn::Reciprocal => Some("Reciprocal"),
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

/// Binary elementwise functions with numpy broadcasting; the result has the operands'
/// float dtype.
///
/// `Minimum` and `Maximum` propagate NaN (as `torch.minimum`/`torch.maximum` and ONNX
/// `Min`/`Max`); where the operands tie, each receives half the gradient, as in PyTorch.
/// The comparisons give a mask, 1 where the relation holds and 0 elsewhere (0 for NaN
/// operands), in the operands' dtype; they have no gradient. `Pow` is C's `powf` (NaN for a
/// negative base and a fractional exponent); its gradients are PyTorch's: none to the base
/// where the exponent is 0, none to the exponent where the base is 0 and the exponent is not
/// negative.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BinaryFn {
    Add,
    Sub,
    Mul,
    Div,
    Minimum,
    Maximum,
    Less,
    LessEqual,
    Greater,
    GreaterEqual,
    Equal,
    Pow,
}

impl BinaryFn {
    /// The comparisons, with their `.mdl` names: each gives a 0/1 mask.
    pub const COMPARISONS: &[(BinaryFn, &'static str)] = &[
        (BinaryFn::Less, "less"),
        (BinaryFn::LessEqual, "less_equal"),
        (BinaryFn::Greater, "greater"),
        (BinaryFn::GreaterEqual, "greater_equal"),
        (BinaryFn::Equal, "equal"),
    ];

    /// Whether the function is a comparison (a mask with no gradient).
    pub fn is_comparison(self) -> bool {
        Self::COMPARISONS.iter().any(|(f, _)| *f == self)
    }

    /// `f(a, b)` for one pair of elements: the formula both backends compute.
    pub fn eval(self, a: f32, b: f32) -> f32 {
        let mask = |c: bool| if c { 1.0 } else { 0.0 };
        match self {
            BinaryFn::Add => a + b,
            BinaryFn::Sub => a - b,
            BinaryFn::Mul => a * b,
            BinaryFn::Div => a / b,
            BinaryFn::Minimum if a.is_nan() || a < b => a,
            BinaryFn::Minimum => b,
            BinaryFn::Maximum if a.is_nan() || a > b => a,
            BinaryFn::Maximum => b,
            BinaryFn::Less => mask(a < b),
            BinaryFn::LessEqual => mask(a <= b),
            BinaryFn::Greater => mask(a > b),
            BinaryFn::GreaterEqual => mask(a >= b),
            BinaryFn::Equal => mask(a == b),
            BinaryFn::Pow => a.powf(b),
        }
    }
}

/// Constant bounds of `clamp`: either may be absent (unbounded on that side).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct Bounds {
    /// The lower bound; `None` leaves values below unclamped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lo: Option<f32>,
    /// The upper bound, applied after the lower one; `None` leaves values above unclamped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hi: Option<f32>,
}

impl Bounds {
    /// `clamp(x)`: `lo` below `lo`, then `hi` above `hi` (so `hi` wins when `lo > hi`, as in
    /// `torch.clamp`); NaN stays NaN.
    pub fn clamp(self, x: f32) -> f32 {
        let x = match self.lo {
            Some(lo) if x < lo => lo,
            _ => x,
        };
        match self.hi {
            Some(hi) if x > hi => hi,
            _ => x,
        }
    }

    /// Whether the gradient passes at `x`: `lo <= x <= hi`, bounds included (PyTorch's
    /// rule: at a bound the gradient flows to `x`); false for NaN.
    pub fn passes(self, x: f32) -> bool {
        self.lo.is_none_or(|lo| x >= lo) && self.hi.is_none_or(|hi| x <= hi) && !x.is_nan()
    }
}

#[cfg(test)]
mod tests {
    use super::UnaryFn;

    #[test]
    fn unary_tables_agree() {
        let mut seen = std::collections::HashSet::new();
        assert!(UnaryFn::ALL.iter().all(|f| seen.insert(*f)));
        assert_eq!(UnaryFn::ALL.len(), 14);
        for f in UnaryFn::ALL {
            if let Some(onnx) = f.onnx_name() {
                assert_eq!(onnx.to_lowercase(), f.name());
            }
        }
        let gelu = UnaryFn::ALL.iter().find(|f| f.name() == "gelu");
        assert_eq!(gelu, Some(&UnaryFn::GeluTanh));
    }
}
