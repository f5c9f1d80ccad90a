//! Elementwise kernels: unary functions and their derivatives, broadcasting binary ops, affine.

use rayon::prelude::*;

use crate::exec::kernels::layout::{broadcast_strides, for_rows, row_offset, CHUNK};
use crate::ir::{BinaryFn, UnaryFn};

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_C: f32 = 0.044_715;
const INV_SQRT_2PI: f32 = 0.398_942_3;

fn sigmoid(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

fn eval(f: UnaryFn, x: f32) -> f32 {
    match f {
        UnaryFn::Neg => -x,
        UnaryFn::Exp => x.exp(),
        UnaryFn::Log => x.ln(),
        UnaryFn::Sqrt => x.sqrt(),
        UnaryFn::Rsqrt => 1.0 / x.sqrt(),
        UnaryFn::Tanh => x.tanh(),
        UnaryFn::Sigmoid => sigmoid(x),
        UnaryFn::Relu => x.max(0.0),
        UnaryFn::GeluTanh => 0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + GELU_C * x * x * x)).tanh()),
        UnaryFn::GeluErf => 0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2)),
        UnaryFn::Silu => x * sigmoid(x),
        UnaryFn::Erf => libm::erff(x),
        // max(x, 0) + log1p(exp(-|x|)): no overflow, and x itself once exp(-|x|) underflows.
        UnaryFn::Softplus => x.max(0.0) + (-x.abs()).exp().ln_1p(),
        UnaryFn::Reciprocal => 1.0 / x,
    }
}

fn derivative(f: UnaryFn, x: f32) -> f32 {
    match f {
        UnaryFn::Neg => -1.0,
        UnaryFn::Exp | UnaryFn::Tanh | UnaryFn::Sigmoid | UnaryFn::Relu => {
            output_derivative(f, eval(f, x))
        }
        UnaryFn::Log => 1.0 / x,
        UnaryFn::Sqrt => 0.5 / x.sqrt(),
        UnaryFn::Rsqrt => -0.5 / (x * x.sqrt()),
        UnaryFn::GeluTanh => {
            let t = (SQRT_2_OVER_PI * (x + GELU_C * x * x * x)).tanh();
            0.5 * (1.0 + t)
                + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_C * x * x)
        }
        UnaryFn::GeluErf => {
            let cdf = 0.5 * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2));
            cdf + x * INV_SQRT_2PI * (-0.5 * x * x).exp()
        }
        UnaryFn::Silu => {
            let s = sigmoid(x);
            s * (1.0 + x * (1.0 - s))
        }
        UnaryFn::Erf => std::f32::consts::FRAC_2_SQRT_PI * (-x * x).exp(),
        UnaryFn::Softplus => sigmoid(x),
        UnaryFn::Reciprocal => -1.0 / (x * x),
    }
}

/// `f'(x)` from `y = f(x)` for the functions where [`UnaryFn::derivative_from_output`]
/// holds (NaN for the others, which never reach it).
fn output_derivative(f: UnaryFn, y: f32) -> f32 {
    match f {
        UnaryFn::Exp => y,
        UnaryFn::Tanh => 1.0 - y * y,
        UnaryFn::Sigmoid => y * (1.0 - y),
        UnaryFn::Relu => {
            if y > 0.0 {
                1.0
            } else {
                0.0
            }
        }
        _ => f32::NAN,
    }
}

/// Computes `out[i] = f(x[i])` for every element.
pub fn unary_forward(f: UnaryFn, x: &[f32], out: &mut [f32]) {
    debug_assert_eq!(x.len(), out.len());
    out.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .for_each(|(o, x)| o.iter_mut().zip(x).for_each(|(o, &x)| *o = eval(f, x)));
}

/// Computes `dx[i] = f'(x[i]) * dy[i]`, where `x` is the forward input.
pub fn unary_backward(f: UnaryFn, x: &[f32], dy: &[f32], dx: &mut [f32]) {
    times_slope(x, dy, dx, |x| derivative(f, x));
}

/// Computes `dx[i] = f'(x[i]) * dy[i]` from the forward output `y = f(x)`, for the
/// functions where [`UnaryFn::derivative_from_output`] holds; bitwise what
/// [`unary_backward`] gives from `x`.
pub fn unary_output_backward(f: UnaryFn, y: &[f32], dy: &[f32], dx: &mut [f32]) {
    times_slope(y, dy, dx, |y| output_derivative(f, y));
}

/// `dx[i] = slope(v[i]) * dy[i]`.
fn times_slope(v: &[f32], dy: &[f32], dx: &mut [f32], slope: impl Fn(f32) -> f32 + Sync) {
    debug_assert_eq!(v.len(), dx.len());
    debug_assert_eq!(dy.len(), dx.len());
    dx.par_chunks_mut(CHUNK)
        .zip(v.par_chunks(CHUNK).zip(dy.par_chunks(CHUNK)))
        .for_each(|(d, (v, dy))| {
            for ((d, &v), &g) in d.iter_mut().zip(v).zip(dy) {
                *d = slope(v) * g;
            }
        });
}

/// `out = op(a, b)` with numpy broadcasting of both operands to `out_shape`, row by row.
fn binary_with(
    op: impl Fn(f32, f32) -> f32 + Sync,
    (a, a_shape): (&[f32], &[usize]),
    (b, b_shape): (&[f32], &[usize]),
    out: &mut [f32],
    out_shape: &[usize],
) {
    let sa = broadcast_strides(a_shape, out_shape);
    let sb = broadcast_strides(b_shape, out_shape);
    let (ia, ib) = (
        sa.last().copied().unwrap_or(0),
        sb.last().copied().unwrap_or(0),
    );
    for_rows(out, out_shape, |r, row| {
        let oa = row_offset(r, out_shape, &sa);
        let ob = row_offset(r, out_shape, &sb);
        for (t, o) in row.iter_mut().enumerate() {
            *o = op(a[oa + t * ia], b[ob + t * ib]);
        }
    });
}

/// Computes `out = a (op) b` with numpy broadcasting; `a_shape` and `b_shape` may have lower
/// rank than `out_shape` and are right-aligned to it.
pub fn binary(
    f: BinaryFn,
    a: &[f32],
    a_shape: &[usize],
    b: &[f32],
    b_shape: &[usize],
    out: &mut [f32],
    out_shape: &[usize],
) {
    debug_assert_eq!(out.len(), out_shape.iter().product::<usize>());
    let (a, b) = ((a, a_shape), (b, b_shape));
    match f {
        BinaryFn::Add => binary_with(|x, y| x + y, a, b, out, out_shape),
        BinaryFn::Sub => binary_with(|x, y| x - y, a, b, out, out_shape),
        BinaryFn::Mul => binary_with(|x, y| x * y, a, b, out, out_shape),
        BinaryFn::Div => binary_with(|x, y| x / y, a, b, out, out_shape),
        f => binary_with(move |x, y| f.eval(x, y), a, b, out, out_shape),
    }
}

/// Computes `out[i] = x[i] * scale + shift`.
pub fn affine(x: &[f32], scale: f32, shift: f32, out: &mut [f32]) {
    debug_assert_eq!(x.len(), out.len());
    out.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .for_each(|(o, x)| {
            o.iter_mut()
                .zip(x)
                .for_each(|(o, &x)| *o = x * scale + shift)
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::kernels::reduce::{broadcast_to, sum_to};
    use crate::exec::kernels::testing::{central_diff, dot, rel_err, Rng};

    fn input_for(f: UnaryFn, rng: &mut Rng, n: usize) -> Vec<f32> {
        let x = rng.vec(n);
        match f {
            // Domain restriction, and keep away from the relu kink.
            UnaryFn::Log | UnaryFn::Sqrt | UnaryFn::Rsqrt | UnaryFn::Reciprocal => {
                x.iter().map(|v| v.abs() + 0.5).collect()
            }
            UnaryFn::Relu => x
                .iter()
                .map(|v| if v.abs() < 0.1 { v + 0.2 } else { *v })
                .collect(),
            _ => x.iter().map(|v| v * 3.0).collect(),
        }
    }

    #[test]
    fn unary_forward_matches_reference() {
        let x = [-2.0f32, -0.5, 0.0, 0.7, 3.0];
        let mut out = [0.0; 5];
        unary_forward(UnaryFn::GeluErf, &x, &mut out);
        // Reference values computed in f64 with Python's math.erf / math.tanh.
        let want = [-0.045_500_3, -0.154_268_8, 0.0, 0.530_625_4, 2.995_950_3];
        for (o, w) in out.iter().zip(want) {
            assert!((o - w).abs() < 1e-5, "{o} vs {w}");
        }
        unary_forward(UnaryFn::GeluTanh, &x, &mut out);
        let want = [-0.045_402_3, -0.154_286, 0.0, 0.530_570_1, 2.996_363];
        for (o, w) in out.iter().zip(want) {
            assert!((o - w).abs() < 1e-5, "{o} vs {w}");
        }
        unary_forward(UnaryFn::Sigmoid, &[-100.0, 100.0], &mut out[..2]);
        assert_eq!(
            &out[..2],
            &[(-100.0f32).exp() / (1.0 + (-100.0f32).exp()), 1.0]
        );
        unary_forward(UnaryFn::Silu, &x, &mut out);
        for (o, &v) in out.iter().zip(&x) {
            assert!((o - v / (1.0 + (-v).exp())).abs() < 1e-6);
        }
    }

    #[test]
    fn softplus_matches_reference_without_overflow() {
        // log1p(exp(x)) in f64 (Python's math), including where exp(x) overflows f32.
        let x = [-2.0f32, -0.5, 0.0, 0.7, 3.0, 30.0, -30.0, 100.0];
        let want = [
            0.126_928_01,
            0.474_077,
            std::f32::consts::LN_2,
            1.103_186,
            3.048_587_4,
            30.0,
            9.357_623e-14,
            100.0,
        ];
        let mut out = [0.0; 8];
        unary_forward(UnaryFn::Softplus, &x, &mut out);
        for (o, w) in out.iter().zip(want) {
            assert!((o - w).abs() <= 1e-6 * w.abs().max(1e-7), "{o} vs {w}");
        }
    }

    /// Central differences in f64-accumulated f32 evaluation: h = 1e-3, tolerance 1e-3
    /// relative per element (plus 1e-4 absolute).
    #[test]
    fn unary_backward_matches_finite_differences() {
        let mut rng = Rng(0x1234_5678);
        for &f in UnaryFn::ALL {
            let x = input_for(f, &mut rng, 5000);
            let dy = rng.vec(x.len());
            let mut dx = vec![0.0; x.len()];
            unary_backward(f, &x, &dy, &mut dx);
            for i in 0..x.len() {
                let slope = central_diff(&x[i..=i], 1e-3, |v| f64::from(eval(f, v[0])))[0];
                let num = slope * dy[i] as f64;
                let err = (dx[i] as f64 - num).abs();
                assert!(
                    err < 1e-3 * num.abs() + 1e-3,
                    "{f:?} x={} dx={} num={num}",
                    x[i],
                    dx[i]
                );
            }
        }
    }

    #[test]
    fn output_form_is_bitwise_the_input_form() {
        let mut rng = Rng(0x9e37_79b9);
        for &f in UnaryFn::ALL.iter().filter(|f| f.derivative_from_output()) {
            let mut x = input_for(f, &mut rng, 4000);
            x.extend([
                0.0,
                -0.0,
                30.0,
                -30.0,
                f32::MIN_POSITIVE,
                -f32::MIN_POSITIVE,
            ]);
            let dy = rng.vec(x.len());
            let mut y = vec![0.0; x.len()];
            unary_forward(f, &x, &mut y);
            let (mut from_x, mut from_y) = (vec![0.0; x.len()], vec![0.0; x.len()]);
            unary_backward(f, &x, &dy, &mut from_x);
            unary_output_backward(f, &y, &dy, &mut from_y);
            for i in 0..x.len() {
                assert_eq!(from_x[i].to_bits(), from_y[i].to_bits(), "{f:?} x={}", x[i]);
            }
        }
    }

    const ALL_BINARY: [BinaryFn; 12] = [
        BinaryFn::Add,
        BinaryFn::Sub,
        BinaryFn::Mul,
        BinaryFn::Div,
        BinaryFn::Minimum,
        BinaryFn::Maximum,
        BinaryFn::Less,
        BinaryFn::LessEqual,
        BinaryFn::Greater,
        BinaryFn::GreaterEqual,
        BinaryFn::Equal,
        BinaryFn::Pow,
    ];

    #[test]
    fn extrema_propagate_nan_and_comparisons_give_masks() {
        let nan = f32::NAN;
        for (a, b) in [(nan, 1.0), (1.0, nan)] {
            assert!(BinaryFn::Minimum.eval(a, b).is_nan());
            assert!(BinaryFn::Maximum.eval(a, b).is_nan());
            for (f, _) in BinaryFn::COMPARISONS {
                assert_eq!(f.eval(a, b), 0.0, "{f:?}");
            }
        }
        assert_eq!(BinaryFn::Maximum.eval(-1.0, 2.0), 2.0);
        assert_eq!(BinaryFn::Minimum.eval(-1.0, 2.0), -1.0);
        assert_eq!(BinaryFn::LessEqual.eval(2.0, 2.0), 1.0);
        assert_eq!(BinaryFn::Less.eval(2.0, 2.0), 0.0);
    }

    fn naive_binary(
        f: BinaryFn,
        a: &[f32],
        sa: &[usize],
        b: &[f32],
        sb: &[usize],
        so: &[usize],
    ) -> Vec<f32> {
        let n: usize = so.iter().product();
        let index = |mut flat: usize, shape: &[usize]| {
            // Map an out flat index into the (right-aligned, broadcast) source.
            let mut idx = vec![0; so.len()];
            for d in (0..so.len()).rev() {
                idx[d] = flat % so[d];
                flat /= so[d];
            }
            let lead = so.len() - shape.len();
            let mut off = 0;
            for (s, &ext) in shape.iter().enumerate() {
                off = off * ext + if ext == 1 { 0 } else { idx[s + lead] };
            }
            off
        };
        (0..n)
            .map(|i| {
                let (x, y) = (a[index(i, sa)], b[index(i, sb)]);
                match f {
                    BinaryFn::Add => x + y,
                    BinaryFn::Sub => x - y,
                    BinaryFn::Mul => x * y,
                    BinaryFn::Div => x / y,
                    BinaryFn::Minimum => x.min(y),
                    BinaryFn::Maximum => x.max(y),
                    BinaryFn::Less => f32::from(u8::from(x < y)),
                    BinaryFn::LessEqual => f32::from(u8::from(x <= y)),
                    BinaryFn::Greater => f32::from(u8::from(x > y)),
                    BinaryFn::GreaterEqual => f32::from(u8::from(x >= y)),
                    BinaryFn::Equal => f32::from(u8::from(x == y)),
                    BinaryFn::Pow => x.powf(y),
                }
            })
            .collect()
    }

    #[test]
    fn binary_broadcasting_matches_naive() {
        let mut rng = Rng(99);
        let cases: [(&[usize], &[usize], &[usize]); 7] = [
            (&[2, 3, 4], &[2, 3, 4], &[2, 3, 4]),
            (&[2, 3, 4], &[4], &[2, 3, 4]),
            (&[2, 1, 4], &[3, 1], &[2, 3, 4]),
            (&[1], &[5, 1], &[5, 7]),
            (&[], &[3], &[3]),
            (&[], &[], &[]),
            (&[0, 3], &[3], &[0, 3]),
        ];
        for (sa, sb, so) in cases {
            let a = rng.vec(sa.iter().product());
            let mut b: Vec<f32> = rng
                .vec(sb.iter().product())
                .iter()
                .map(|v| v + 2.0)
                .collect();
            // Ties for the comparisons and extrema.
            if let (Some(x), Some(y)) = (a.first(), b.first_mut()) {
                *y = *x;
            }
            for f in ALL_BINARY {
                let mut out = vec![f32::NAN; so.iter().product()];
                binary(f, &a, sa, &b, sb, &mut out, so);
                // Bits, so that pow's NaN (a negative base) matches itself.
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&out),
                    bits(&naive_binary(f, &a, sa, &b, sb, so)),
                    "{f:?} {sa:?} {sb:?}"
                );
            }
        }
    }

    #[test]
    fn affine_scales_and_shifts() {
        let x = [1.0f32, -2.0, 0.5];
        let mut out = [0.0; 3];
        affine(&x, 2.0, 1.0, &mut out);
        assert_eq!(out, [3.0, -3.0, 2.0]);
    }

    /// Gradient of `binary` with broadcasting obtained via `sum_to`; relative L2 error below 1e-2 against
    /// h = 1e-2 central differences.
    #[test]
    fn binary_broadcast_backward_via_sum_to() {
        let (sa, sb, so): (&[usize], &[usize], &[usize]) = (&[2, 1, 4], &[3, 1], &[2, 3, 4]);
        let mut rng = Rng(17);
        let a = rng.vec(8);
        let b: Vec<f32> = rng.vec(3).iter().map(|v| v + 2.5).collect();
        let w = rng.vec(24);
        let run = |f: BinaryFn, a: &[f32], b: &[f32]| {
            let mut o = vec![0.0; 24];
            binary(f, a, sa, b, sb, &mut o, so);
            o
        };
        for f in [BinaryFn::Add, BinaryFn::Sub, BinaryFn::Mul, BinaryFn::Div] {
            // Per-element partials d(out)/da and d(out)/db at the broadcast positions.
            let mut ab = vec![0.0; 24];
            let mut bb = vec![0.0; 24];
            broadcast_to(&a, sa, &mut ab, so);
            broadcast_to(&b, sb, &mut bb, so);
            let (pa, pb): (Vec<f32>, Vec<f32>) = ab
                .iter()
                .zip(&bb)
                .map(|(&x, &y)| match f {
                    BinaryFn::Add => (1.0, 1.0),
                    BinaryFn::Sub => (1.0, -1.0),
                    BinaryFn::Mul => (y, x),
                    BinaryFn::Div => (1.0 / y, -x / (y * y)),
                    _ => unreachable!("only arithmetic is differentiated here"),
                })
                .unzip();
            let ga: Vec<f32> = pa.iter().zip(&w).map(|(p, w)| p * w).collect();
            let gb: Vec<f32> = pb.iter().zip(&w).map(|(p, w)| p * w).collect();
            let (mut da, mut db) = (vec![0.0; 8], vec![0.0; 3]);
            sum_to(&ga, so, &mut da, sa);
            sum_to(&gb, so, &mut db, sb);
            assert!(
                rel_err(&da, &central_diff(&a, 1e-2, |a| dot(&run(f, a, &b), &w))) < 1e-2,
                "{f:?} a"
            );
            assert!(
                rel_err(&db, &central_diff(&b, 1e-2, |b| dot(&run(f, &a, b), &w))) < 1e-2,
                "{f:?} b"
            );
        }
    }
}
