//! Cases of the selection kernels: extrema and comparisons (broadcasting), `where` over three
//! broadcast operands, `clamp` with one or two bounds and its backward, `reciprocal`, and a
//! unary function beside its gradient (`unary_pair`).

use super::t;
use memc::ir::{BinaryFn, Bounds, DType, Op, TensorType, UnaryFn};

/// (label, op, f32 inputs) of every selection kernel.
pub fn select_cases() -> Vec<(&'static str, Op, Vec<TensorType>)> {
    let f = |s: &[usize]| t(DType::F32, s);
    let both = Bounds {
        lo: Some(-0.5),
        hi: Some(1.0),
    };
    let upper = Bounds {
        lo: None,
        hi: Some(0.5),
    };
    let mut cases = vec![
        ("where", Op::Where, vec![f(&[3, 1]), f(&[2, 3, 4]), f(&[1])]),
        ("where_same", Op::Where, vec![f(&[70]), f(&[70]), f(&[70])]),
        ("clamp", Op::Clamp(both), vec![f(&[4, 33])]),
        ("clamp_upper", Op::Clamp(upper), vec![f(&[5, 7])]),
        (
            "clamp_bwd",
            Op::ClampBackward(both),
            vec![f(&[4, 33]), f(&[4, 33])],
        ),
        (
            "clamp_upper_bwd",
            Op::ClampBackward(upper),
            vec![f(&[9]), f(&[9])],
        ),
        (
            "reciprocal",
            Op::Unary(UnaryFn::Reciprocal),
            vec![f(&[4, 33])],
        ),
        (
            "reciprocal_bwd",
            Op::UnaryBackward(UnaryFn::Reciprocal),
            vec![f(&[4, 33]), f(&[4, 33])],
        ),
        // Backward's recomputed GELU beside its gradient, one launch (384 elements: the
        // gradient starts right after the activation in every type).
        (
            "gelu_pair",
            Op::UnaryPair(UnaryFn::GeluTanh),
            vec![f(&[3, 128]), f(&[3, 128])],
        ),
    ];
    let binary: [(&'static str, BinaryFn); 8] = [
        ("minimum", BinaryFn::Minimum),
        ("maximum", BinaryFn::Maximum),
        ("less", BinaryFn::Less),
        ("less_equal", BinaryFn::LessEqual),
        ("greater", BinaryFn::Greater),
        ("greater_equal", BinaryFn::GreaterEqual),
        ("equal", BinaryFn::Equal),
        ("pow", BinaryFn::Pow),
    ];
    for (label, fun) in binary {
        cases.push((label, Op::Binary(fun), vec![f(&[2, 3, 4]), f(&[3, 1])]));
    }
    cases
}
