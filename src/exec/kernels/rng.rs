//! Counter-based random numbers (a splitmix64 hash of seed, step and index): pure functions,
//! so recomputing a value (e.g. a dropout mask in the backward pass) reproduces it exactly.

use rayon::prelude::*;

/// splitmix64 finalizer: a bijective 64-bit mix.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Hash of (seed, step, index) for an independent stream `lane`.
fn hash(seed: u64, step: u64, index: u64, lane: u64) -> u64 {
    mix(mix(mix(mix(seed) ^ step) ^ index) ^ lane)
}

/// 24 random bits from a hash as an f32 in [0, 1).
fn unit(h: u64) -> f32 {
    (h >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
}

/// Uniform value in [0, 1) determined purely by (seed, step, index).
pub fn uniform01(seed: u64, step: u64, index: u64) -> f32 {
    unit(hash(seed, step, index, 0))
}

/// Standard normal value determined purely by (seed, step, index): Box-Muller of two uniforms
/// drawn from streams independent of [`uniform01`].
pub fn normal01(seed: u64, step: u64, index: u64) -> f32 {
    let u1 = 1.0 - unit(hash(seed, step, index, 1)); // (0, 1]: ln is finite
    let u2 = unit(hash(seed, step, index, 2));
    (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
}

/// Dropout: `out[i] = x[i] * (1 / (1 - p))` if `uniform01(seed, step, i) >= p`, else 0. The backward
/// is the same call on dy (same mask and scale).
pub fn dropout(x: &[f32], p: f32, seed: u64, step: u64, out: &mut [f32]) {
    debug_assert_eq!(x.len(), out.len());
    const CHUNK: usize = 4096;
    let scale = 1.0 / (1.0 - p);
    out.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .enumerate()
        .for_each(|(c, (o, x))| {
            for (t, (o, &x)) in o.iter_mut().zip(x).enumerate() {
                let keep = uniform01(seed, step, (c * CHUNK + t) as u64) >= p;
                *o = if keep { x * scale } else { 0.0 };
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_mean_and_purity() {
        let n = 100_000u64;
        let mean: f64 = (0..n).map(|i| f64::from(uniform01(42, 7, i))).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
        assert!((0..1000).all(|i| uniform01(42, 7, i) == uniform01(42, 7, i)));
        assert!((0..1000).all(|i| (0.0..1.0).contains(&uniform01(1, 2, i))));
        assert_ne!(uniform01(42, 7, 3), uniform01(42, 8, 3));
        assert_ne!(uniform01(42, 7, 3), uniform01(43, 7, 3));
    }

    #[test]
    fn normal_moments() {
        let n = 100_000u64;
        let xs: Vec<f64> = (0..n).map(|i| f64::from(normal01(3, 0, i))).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(
            mean.abs() < 0.02 && (var - 1.0).abs() < 0.03,
            "{mean} {var}"
        );
        assert!(xs.iter().all(|x| x.is_finite()));
        assert_eq!(normal01(3, 0, 17), normal01(3, 0, 17));
    }

    #[test]
    fn dropout_mask_is_reproducible() {
        let x: Vec<f32> = (0..10_000).map(|i| i as f32 + 1.0).collect();
        let (mut a, mut b) = (vec![0.0; x.len()], vec![0.0; x.len()]);
        dropout(&x, 0.25, 9, 4, &mut a);
        dropout(&x, 0.25, 9, 4, &mut b);
        assert_eq!(a, b);
        let kept = a.iter().filter(|&&v| v != 0.0).count() as f64 / x.len() as f64;
        assert!((kept - 0.75).abs() < 0.02);
        for (i, (&o, &v)) in a.iter().zip(&x).enumerate() {
            let keep = uniform01(9, 4, i as u64) >= 0.25;
            assert_eq!(o, if keep { v * (1.0 / 0.75) } else { 0.0 });
        }
        dropout(&x, 0.0, 9, 4, &mut a);
        assert_eq!(a, x);
    }
}
