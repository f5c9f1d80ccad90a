//! Counter-based random numbers (a splitmix64 hash of seed, step and index): pure functions,
//! so recomputing a value (e.g. a dropout mask in the backward pass) reproduces it exactly.
//! Shared by dropout, parameter initialization and synthetic inputs.

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

/// 32 random bits determined purely by (seed, step, index), from a stream independent of
/// [`uniform01`] and [`normal01`] (`memc_bits` in `rng.cu` is the same function).
pub fn bits(seed: u64, step: u64, index: u64) -> u32 {
    (hash(seed, step, index, 3) >> 32) as u32
}

/// Standard normal value determined purely by (seed, step, index): Box-Muller of two uniforms
/// drawn from streams independent of [`uniform01`].
pub fn normal01(seed: u64, step: u64, index: u64) -> f32 {
    let u1 = 1.0 - unit(hash(seed, step, index, 1)); // (0, 1]: ln is finite
    let u2 = unit(hash(seed, step, index, 2));
    (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
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
}
