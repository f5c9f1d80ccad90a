//! Optimizer updates applied in place (AdamW, SGD with momentum) and the sum of squares used
//! for global-norm gradient clipping.

use rayon::prelude::*;

/// Elements per parallel task.
const CHUNK: usize = 4096;

/// One torch.optim.AdamW step `t` (1-based), in place, with `g` first multiplied by
/// `grad_scale`: `m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr*wd*p;
/// p -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)`.
#[allow(clippy::too_many_arguments)]
pub fn adamw_update(
    p: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    lr: f32,
    b1: f32,
    b2: f32,
    eps: f32,
    wd: f32,
    t: u64,
    grad_scale: f32,
) {
    let t = i32::try_from(t).unwrap_or(i32::MAX);
    let bc1 = (1.0 - f64::from(b1).powi(t)) as f32;
    let bc2 = (1.0 - f64::from(b2).powi(t)) as f32;
    p.par_chunks_mut(CHUNK)
        .zip(g.par_chunks(CHUNK))
        .zip(m.par_chunks_mut(CHUNK).zip(v.par_chunks_mut(CHUNK)))
        .for_each(|((p, g), (m, v))| {
            for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m).zip(v) {
                let g = g * grad_scale;
                *m = b1 * *m + (1.0 - b1) * g;
                *v = b2 * *v + (1.0 - b2) * g * g;
                *p -= lr * wd * *p;
                *p -= lr * (*m / bc1) / ((*v / bc2).sqrt() + eps);
            }
        });
}

/// One torch.optim.SGD step `t` (1-based) with momentum (dampening 0, no nesterov), in place:
/// `g' = g*grad_scale + wd*p; buf = momentum*buf + g'` (`buf = g'` at t == 1 or when momentum
/// is 0); `p -= lr*buf`.
#[allow(clippy::too_many_arguments)]
pub fn sgd_update(
    p: &mut [f32],
    g: &[f32],
    buf: &mut [f32],
    lr: f32,
    momentum: f32,
    wd: f32,
    t: u64,
    grad_scale: f32,
) {
    let fresh = t <= 1 || momentum == 0.0;
    p.par_chunks_mut(CHUNK)
        .zip(g.par_chunks(CHUNK).zip(buf.par_chunks_mut(CHUNK)))
        .for_each(|(p, (g, buf))| {
            for ((p, &g), b) in p.iter_mut().zip(g).zip(buf) {
                let g = g * grad_scale + wd * *p;
                *b = if fresh { g } else { momentum * *b + g };
                *p -= lr * *b;
            }
        });
}

/// Sum of squares of `x` accumulated in f64 in a fixed order (fixed-size blocks summed in
/// parallel, then the block sums in order), so the result is independent of thread count.
pub fn sum_squares(x: &[f32]) -> f64 {
    let partials: Vec<f64> = x
        .par_chunks(1 << 16)
        .map(|c| c.iter().map(|&v| f64::from(v) * f64::from(v)).sum())
        .collect();
    partials.iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference values computed independently in f64 (Python) from the torch AdamW formulas
    /// for p0 = [0.5, -1.0, 2.0], lr 0.1, betas (0.9, 0.999), eps 1e-8, wd 0.01, grad_scale 0.5,
    /// grads per step g1 = [0.2, -0.4, 1.0], g2 = [-0.6, 0.1, 0.8], g3 = [0.3, 0.3, -2.0].
    #[test]
    fn adamw_three_steps_match_reference() {
        let mut p = [0.5f32, -1.0, 2.0];
        let (mut m, mut v) = ([0.0f32; 3], [0.0f32; 3]);
        let grads = [[0.2f32, -0.4, 1.0], [-0.6, 0.1, 0.8], [0.3, 0.3, -2.0]];
        let want: [[f64; 3]; 3] = ADAM_REF;
        for (t, g) in grads.iter().enumerate() {
            adamw_update(
                &mut p,
                g,
                &mut m,
                &mut v,
                0.1,
                0.9,
                0.999,
                1e-8,
                0.01,
                t as u64 + 1,
                0.5,
            );
            for (a, b) in p.iter().zip(&want[t]) {
                assert!(
                    (f64::from(*a) - b).abs() < 1e-5,
                    "step {}: {a} vs {b}",
                    t + 1
                );
            }
        }
    }

    const ADAM_REF: [[f64; 3]; 3] = [
        [0.399_500_01, -0.899_000_005, 1.898_000_002],
        [0.448_519_491_11, -0.851_154_191_095, 1.797_289_423_768],
        [0.455_192_377_739, -0.858_576_875_344, 1.808_137_578_306],
    ];

    #[test]
    fn sgd_momentum_matches_formula() {
        let mut p = [1.0f32, -2.0];
        let mut buf = [f32::NAN; 2];
        let g = [0.5f32, 0.25];
        // t = 1: g' = g*2 + 0.1*p = [1.1, 0.3]; buf = g'; p = [0.89, -2.03].
        sgd_update(&mut p, &g, &mut buf, 0.1, 0.9, 0.1, 1, 2.0);
        assert!((p[0] - 0.89).abs() < 1e-6 && (p[1] + 2.03).abs() < 1e-6);
        // t = 2: g' = [1.089, 0.297]; buf = 0.9*[1.1, 0.3] + g' = [2.079, 0.567].
        sgd_update(&mut p, &g, &mut buf, 0.1, 0.9, 0.1, 2, 2.0);
        assert!((buf[0] - 2.079).abs() < 1e-6 && (buf[1] - 0.567).abs() < 1e-6);
        assert!((p[0] - (0.89 - 0.2079)).abs() < 1e-6 && (p[1] - (-2.03 - 0.0567)).abs() < 1e-6);
    }

    #[test]
    fn sum_squares_is_exact_on_small_ints() {
        let x: Vec<f32> = (0..200_000).map(|i| (i % 7) as f32).collect();
        let want: f64 = (0..200_000u64).map(|i| ((i % 7) * (i % 7)) as f64).sum();
        assert_eq!(sum_squares(&x), want);
        assert_eq!(sum_squares(&[]), 0.0);
    }
}
