//! Optimizer updates applied in place (AdamW, SGD with momentum), the global-norm clip
//! coefficient, and dynamic loss scaling (overflow check and scale update).

use crate::exec::kernels::rng;
use crate::ops::optimizer::quantize::round_bf16_stochastic;
use crate::ops::optimizer::{AdamWParams, Rounding, SgdParams};
use rayon::prelude::*;

/// Elements per parallel task.
const CHUNK: usize = 4096;

/// The constants of one torch.optim.AdamW step `t` (1-based) on gradients multiplied by
/// `grad_scale`, and its arithmetic on one element. `optim.cu`'s `adamw_element` performs the
/// same f32 operations in the same order with round-to-nearest intrinsics (never fused), and
/// both take the bias corrections from the same f64 `pow`, so the CPU and CUDA updates agree
/// bit for bit.
#[derive(Debug, Clone, Copy)]
pub struct AdamWStep {
    params: AdamWParams,
    bc1: f32,
    bc2: f32,
    /// The gradient multiplier (the clip coefficient or loss-scale unscale; 1 without).
    pub grad_scale: f32,
}

impl AdamWStep {
    /// Step `t` of `params` (bias corrections `1 - beta^t` in f64, `t` capped at 2^31 - 1).
    pub fn new(params: &AdamWParams, t: u64, grad_scale: f32) -> AdamWStep {
        let t = t.min(0x7fff_ffff) as f64;
        AdamWStep {
            params: *params,
            bc1: (1.0 - f64::from(params.beta1).powf(t)) as f32,
            bc2: (1.0 - f64::from(params.beta2).powf(t)) as f32,
            grad_scale,
        }
    }

    /// `(p, m, v)` after the step on one element with raw gradient `g`: `g *= grad_scale;
    /// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr*wd*p; p -= lr * (m/(1-b1^t)) /
    /// (sqrt(v/(1-b2^t)) + eps)`.
    pub fn apply(&self, p: f32, g: f32, m: f32, v: f32) -> (f32, f32, f32) {
        let AdamWParams {
            lr,
            beta1: b1,
            beta2: b2,
            eps,
            weight_decay: wd,
            ..
        } = self.params;
        let g = g * self.grad_scale;
        let m = b1 * m + (1.0 - b1) * g;
        let v = b2 * v + (1.0 - b2) * g * g;
        let p = p - lr * wd * p;
        let p = p - lr * (m / self.bc1) / ((v / self.bc2).sqrt() + eps);
        (p, m, v)
    }
}

/// How an update stores its parameter: as computed (nearest on store), or rounded to bf16
/// stochastically with random bits keyed by the micro-step's dropout `stream`, the
/// parameter's `key` and the element.
#[derive(Debug, Clone, Copy)]
pub struct Store {
    stochastic: Option<(u64, u64)>,
}

impl Store {
    /// The store of an update with `rounding` in a micro-step whose dropout stream is `stream`.
    pub fn new(rounding: Rounding, stream: u64) -> Store {
        Store {
            stochastic: match rounding {
                Rounding::Nearest => None,
                Rounding::Stochastic { key } => Some((stream, key)),
            },
        }
    }

    /// The value to store for element `i` holding `x`.
    pub fn value(&self, x: f32, i: usize) -> f32 {
        match self.stochastic {
            None => x,
            Some((stream, key)) => round_bf16_stochastic(x, rng::bits(stream, key, i as u64)),
        }
    }
}

/// One AdamW step ([`AdamWStep`]) in place; a `grad_scale` of 0 (an overflowed loss-scaled
/// step) skips it.
pub fn adamw_update(
    p: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    step: &AdamWStep,
    store: Store,
) {
    if step.grad_scale == 0.0 {
        return;
    }
    p.par_chunks_mut(CHUNK)
        .zip(g.par_chunks(CHUNK))
        .zip(m.par_chunks_mut(CHUNK).zip(v.par_chunks_mut(CHUNK)))
        .enumerate()
        .for_each(|(c, ((p, g), (m, v)))| {
            for (j, (((p, &g), m), v)) in p.iter_mut().zip(g).zip(m).zip(v).enumerate() {
                let (pn, mn, vn) = step.apply(*p, g, *m, *v);
                (*p, *m, *v) = (store.value(pn, c * CHUNK + j), mn, vn);
            }
        });
}

/// One torch.optim.SGD step `t` (1-based) with momentum (dampening 0, no nesterov), in place:
/// `g' = g*grad_scale + wd*p; buf = momentum*buf + g'` (`buf = g'` at t == 1 or when momentum
/// is 0); `p -= lr*buf`. A `grad_scale` of 0 skips the step.
pub fn sgd_update(
    p: &mut [f32],
    g: &[f32],
    buf: &mut [f32],
    params: &SgdParams,
    (t, grad_scale): (u64, f32),
    store: Store,
) {
    if grad_scale == 0.0 {
        return;
    }
    let SgdParams {
        lr,
        momentum,
        weight_decay: wd,
        ..
    } = *params;
    let fresh = t <= 1 || momentum == 0.0;
    p.par_chunks_mut(CHUNK)
        .zip(g.par_chunks(CHUNK).zip(buf.par_chunks_mut(CHUNK)))
        .enumerate()
        .for_each(|(c, (p, (g, buf)))| {
            for (j, ((p, &g), b)) in p.iter_mut().zip(g).zip(buf).enumerate() {
                let g = g * grad_scale + wd * *p;
                *b = if fresh { g } else { momentum * *b + g };
                *p = store.value(*p - lr * *b, c * CHUNK + j);
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

/// `m * min(1, max_norm / (m * sqrt(sum_squares) + 1e-6))`: the clip coefficient of
/// gradients whose squares sum to `sum_squares` once multiplied by `m` (the loss-scale
/// multiplier, 1 without loss scaling), times `m`. An `m` of 0 (skipped step) gives 0.
pub fn clip_coefficient(max_norm: f32, sum_squares: f64, m: f64) -> f32 {
    if m == 0.0 {
        return 0.0;
    }
    let c = f64::from(max_norm) / (m * sum_squares.sqrt() + 1e-6);
    (m * c.min(1.0)) as f32
}

/// One micro-step of gradient accumulation over `micro_steps` micro-batches: `acc = g /
/// micro_steps` on the first micro-step of a step (`first`), `acc += g / micro_steps` after.
pub fn accumulate_grad(acc: &mut [f32], g: &[f32], micro_steps: u32, first: bool) {
    let scale = 1.0 / micro_steps as f32;
    acc.par_chunks_mut(CHUNK)
        .zip(g.par_chunks(CHUNK))
        .for_each(|(acc, g)| {
            for (a, &gi) in acc.iter_mut().zip(g) {
                *a = if first { gi * scale } else { *a + gi * scale };
            }
        });
}

/// Whether every element of `x` is finite (no inf, no NaN).
pub fn all_finite(x: &[f32]) -> bool {
    x.par_chunks(1 << 16)
        .all(|c| c.iter().all(|v| v.is_finite()))
}

/// torch.amp.GradScaler.update on one step's `multiplier` (0 after an overflow): halve the
/// scale and reset the clean-step count on overflow; otherwise count the step and double the
/// scale once `growth_interval` clean steps have passed.
pub fn loss_scale_update(scale: &mut f32, clean: &mut f32, multiplier: f32, growth_interval: u32) {
    if multiplier == 0.0 {
        *scale *= 0.5;
        *clean = 0.0;
    } else if *clean + 1.0 >= growth_interval as f32 {
        *scale *= 2.0;
        *clean = 0.0;
    } else {
        *clean += 1.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEAREST: Store = Store { stochastic: None };

    /// AdamW at lr 0.1, beta1 0.9 and eps 1e-8.
    fn adamw(beta2: f32, weight_decay: f32) -> AdamWParams {
        AdamWParams {
            lr: 0.1,
            beta2,
            weight_decay,
            ..AdamWParams::default()
        }
    }

    /// SGD at lr 0.1 and momentum 0.9.
    fn sgd(weight_decay: f32) -> SgdParams {
        SgdParams {
            lr: 0.1,
            momentum: 0.9,
            weight_decay,
            rounding: Rounding::Nearest,
        }
    }

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
            let step = AdamWStep::new(&adamw(0.999, 0.01), t as u64 + 1, 0.5);
            adamw_update(&mut p, g, &mut m, &mut v, &step, NEAREST);
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
        sgd_update(&mut p, &g, &mut buf, &sgd(0.1), (1, 2.0), NEAREST);
        assert!((p[0] - 0.89).abs() < 1e-6 && (p[1] + 2.03).abs() < 1e-6);
        // t = 2: g' = [1.089, 0.297]; buf = 0.9*[1.1, 0.3] + g' = [2.079, 0.567].
        sgd_update(&mut p, &g, &mut buf, &sgd(0.1), (2, 2.0), NEAREST);
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

    #[test]
    fn zero_multiplier_skips_the_update() {
        let (mut p, mut m, mut v) = ([1.0f32, 2.0], [0.5f32; 2], [0.25f32; 2]);
        let step = AdamWStep::new(&adamw(0.99, 0.1), 3, 0.0);
        adamw_update(&mut p, &[1.0, 1.0], &mut m, &mut v, &step, NEAREST);
        assert_eq!((p, m, v), ([1.0, 2.0], [0.5; 2], [0.25; 2]));
        let (mut p, mut buf) = ([1.0f32], [0.5f32]);
        sgd_update(&mut p, &[1.0], &mut buf, &sgd(0.0), (2, 0.0), NEAREST);
        assert_eq!((p, buf), ([1.0], [0.5]));
    }

    #[test]
    fn scaled_clip_coefficient_folds_the_unscale_multiplier() {
        // Gradients of norm 8 at scale 4 are norm 2 unscaled: clip to 1 gives 1/2, times 1/4.
        let c = clip_coefficient(1.0, 64.0, 0.25);
        assert!((c - 0.125).abs() < 1e-6, "{c}");
        // Under the threshold the coefficient is just the multiplier.
        assert_eq!(clip_coefficient(10.0, 64.0, 0.25), 0.25);
        assert_eq!(clip_coefficient(1.0, 64.0, 0.0), 0.0);
        assert!((clip_coefficient(1.0, 16.0, 1.0) - 0.25).abs() < 1e-6);
    }

    #[test]
    fn loss_scale_halves_on_overflow_and_doubles_after_the_interval() {
        let (mut scale, mut clean) = (65536.0f32, 5.0f32);
        loss_scale_update(&mut scale, &mut clean, 0.0, 3);
        assert_eq!((scale, clean), (32768.0, 0.0));
        loss_scale_update(&mut scale, &mut clean, 1.0 / 32768.0, 3);
        loss_scale_update(&mut scale, &mut clean, 1.0 / 32768.0, 3);
        assert_eq!((scale, clean), (32768.0, 2.0));
        loss_scale_update(&mut scale, &mut clean, 1.0 / 32768.0, 3);
        assert_eq!((scale, clean), (65536.0, 0.0));
        assert!(all_finite(&[1.0, -2.0]) && !all_finite(&[1.0, f32::INFINITY]));
        assert!(!all_finite(&[f32::NAN]));
    }
}
