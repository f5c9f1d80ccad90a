//! Softmax backward and log-softmax with its backward along an axis (the forward softmax is
//! shared with the loss kernels in [`crate::exec::kernels::softmax`]). Sums accumulate in f64.

use crate::exec::kernels::softmax::{lane_logsumexp, lanes};

/// Sum over the lane of `p(a[t], b[t])` in f64.
fn lane_sum(a: &[f32], b: &[f32], n: usize, s: usize, p: impl Fn(f32, f32) -> f32) -> f32 {
    (0..n)
        .map(|t| f64::from(p(a[t * s], b[t * s])))
        .sum::<f64>() as f32
}

/// Softmax backward from the forward output `y`: `dx = y * (dy - sum(dy * y))` along `axis`.
pub fn softmax_backward(y: &[f32], dy: &[f32], shape: &[usize], axis: usize, dx: &mut [f32]) {
    lanes(shape, axis, y, dy, dx, |y, dy, o, n, s| {
        let dot = lane_sum(y, dy, n, s, |a, b| a * b);
        (0..n).for_each(|t| o[t * s] = y[t * s] * (dy[t * s] - dot));
    });
}

/// Log-softmax of `x` along `axis`: `out = x - max - ln(sum(exp(x - max)))`.
pub fn log_softmax(x: &[f32], shape: &[usize], axis: usize, out: &mut [f32]) {
    lanes(shape, axis, x, x, out, |x, _, o, n, s| {
        let (m, l) = lane_logsumexp(x, n, s);
        (0..n).for_each(|t| o[t * s] = x[t * s] - m - l);
    });
}

/// Log-softmax backward from the forward output `y`: `dx = dy - exp(y) * sum(dy)` along `axis`.
pub fn log_softmax_backward(y: &[f32], dy: &[f32], shape: &[usize], axis: usize, dx: &mut [f32]) {
    lanes(shape, axis, y, dy, dx, |y, dy, o, n, s| {
        let total = lane_sum(dy, dy, n, s, |a, _| a);
        (0..n).for_each(|t| o[t * s] = dy[t * s] - y[t * s].exp() * total);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::kernels::softmax::softmax;
    use crate::exec::kernels::testing::{central_diff, dot, rel_err, Rng};

    #[test]
    fn softmax_forward_matches_naive_and_sums_to_one() {
        let shape = [2, 5, 3];
        let x: Vec<f32> = Rng(3).vec(30).iter().map(|v| v * 50.0).collect();
        let (mut sm, mut lsm) = (vec![0.0; 30], vec![0.0; 30]);
        softmax(&x, &shape, 1, &mut sm);
        log_softmax(&x, &shape, 1, &mut lsm);
        for o in 0..2 {
            for k in 0..3 {
                let idx: Vec<usize> = (0..5).map(|t| o * 15 + t * 3 + k).collect();
                let m = idx
                    .iter()
                    .map(|&i| f64::from(x[i]))
                    .fold(f64::MIN, f64::max);
                let z: f64 = idx.iter().map(|&i| (f64::from(x[i]) - m).exp()).sum();
                for &i in &idx {
                    let want = f64::from(x[i]) - m - z.ln();
                    assert!((f64::from(lsm[i]) - want).abs() < 1e-4);
                    assert!((f64::from(sm[i]) - want.exp()).abs() < 1e-6);
                }
            }
        }
    }

    /// Tolerance: relative L2 error 1e-2 against h = 1e-2 central differences.
    #[test]
    fn softmax_backwards_match_finite_differences_middle_axis() {
        let shape = [3, 4, 5];
        let mut rng = Rng(5);
        let x = rng.vec(60);
        let w = rng.vec(60);
        for log in [false, true] {
            let fwd = |x: &[f32]| {
                let mut y = vec![0.0; x.len()];
                if log {
                    log_softmax(x, &shape, 1, &mut y);
                } else {
                    softmax(x, &shape, 1, &mut y);
                }
                y
            };
            let y = fwd(&x);
            let mut dx = vec![f32::NAN; 60];
            if log {
                log_softmax_backward(&y, &w, &shape, 1, &mut dx);
            } else {
                softmax_backward(&y, &w, &shape, 1, &mut dx);
            }
            let e = rel_err(&dx, &central_diff(&x, 1e-2, |x| dot(&fwd(x), &w)));
            assert!(e < 1e-2, "log={log} err={e}");
        }
    }
}
