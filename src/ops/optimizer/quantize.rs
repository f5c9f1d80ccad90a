//! Block-wise 8-bit storage of AdamW's moments, as bitsandbytes' 8-bit optimizers keep them
//! (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization"), and stochastic
//! rounding to bf16. Each moment is split into blocks of [`BLOCK`] elements; a block keeps
//! its absolute maximum as one f32 and each element as the index (u8 code) of the value of a
//! 256-entry map nearest to `x / absmax`. The CPU kernels search the maps here; the CUDA
//! kernels get the same tables as literals ([`map_literal`]) and the same search, so both
//! pick the same code for every value.

use std::sync::OnceLock;

/// Elements per quantization block (bitsandbytes' block size for 8-bit optimizer state).
pub const BLOCK: u64 = 2048;

/// Quantization blocks of a moment of `n` elements: one f32 absmax each.
pub fn blocks(n: u64) -> u64 {
    n.div_ceil(BLOCK)
}

/// bitsandbytes' `create_dynamic_map(signed, max_exponent_bits = 7, total_bits = 8)`
/// (dynamic tree quantization): for each exponent `i` in 0..7 the midpoints of
/// `linspace(0.1, 1, k + 1)` scaled by `10^(i - 6)`, with `k = 2^i` values (and their
/// negatives) when `signed` and `k = 2^(i + 1)` when not, then `0` and `1`, sorted. Signed:
/// 127 negative values from -0.9953 up, 0 at code 127, 127 positive values, 1 at code 255
/// (no -1). Unsigned: 0 at code 0, 254 positive values from 5.5e-7, 1 at code 255. Computed
/// in f64 and rounded to f32 once (bitsandbytes rounds its float32 linspace, so an entry may
/// differ from its table in the last bit).
fn dynamic_map(signed: bool) -> [f32; 256] {
    let mut data: Vec<f64> = Vec::with_capacity(256);
    for i in 0..7 {
        let k = if signed { 1u32 << i } else { 1u32 << (i + 1) };
        let scale = 10f64.powi(i - 6);
        for j in 0..k {
            let lo = 0.1 + 0.9 * f64::from(j) / f64::from(k);
            let hi = 0.1 + 0.9 * f64::from(j + 1) / f64::from(k);
            let mean = scale * (lo + hi) / 2.0;
            data.push(mean);
            if signed {
                data.push(-mean);
            }
        }
    }
    data.extend([0.0, 1.0]);
    data.sort_by(f64::total_cmp);
    let mut map = [0f32; 256];
    for (m, d) in map.iter_mut().zip(&data) {
        *m = *d as f32;
    }
    map
}

/// The signed dynamic map (AdamW's first moment), ascending.
pub fn signed_map() -> &'static [f32; 256] {
    static MAP: OnceLock<[f32; 256]> = OnceLock::new();
    MAP.get_or_init(|| dynamic_map(true))
}

/// The unsigned dynamic map (AdamW's second moment), ascending.
pub fn unsigned_map() -> &'static [f32; 256] {
    static MAP: OnceLock<[f32; 256]> = OnceLock::new();
    MAP.get_or_init(|| dynamic_map(false))
}

/// The code of 0 in `map`: the value quantized state starts from (with an absmax of 0 every
/// code decodes to 0, so any would do; this one is also 0 after the first block's absmax).
pub fn zero_code(map: &[f32; 256]) -> u8 {
    nearest(map, 0.0)
}

/// The code whose value in the ascending `map` is nearest to `x`, the lower code on a tie:
/// the first code whose value is not below `x` by a fixed 8-step binary search, then that
/// code or the one below. `optim.cu`'s `memc_nearest_code` is the same search, so CPU and
/// CUDA agree on every input (NaN gives code 0).
pub fn nearest(map: &[f32; 256], x: f32) -> u8 {
    let mut lo = 0usize;
    for step in [128, 64, 32, 16, 8, 4, 2, 1] {
        if map[lo + step - 1] < x {
            lo += step;
        }
    }
    if lo > 0 && x - map[lo - 1] <= map[lo] - x {
        lo -= 1;
    }
    lo as u8
}

/// The value block-normalized: `x / absmax`, or 0 for an all-zero block.
pub fn normalize(x: f32, absmax: f32) -> f32 {
    if absmax > 0.0 {
        x / absmax
    } else {
        0.0
    }
}

/// `x` rounded stochastically to a bf16 value (returned as the f32 it equals exactly): up
/// in magnitude with probability (|x| - |down|) / ulp, where `down` is `x` with its 16 low
/// bits cleared, using the low 16 bits of `random`. Infinities and NaN are returned as they
/// are. The stored bf16 is then exactly this value, whatever the store's own rounding.
pub fn round_bf16_stochastic(x: f32, random: u32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    f32::from_bits(x.to_bits().wrapping_add(random & 0xffff) & 0xffff_0000)
}

/// A `__device__` table `name` of the 256 values of `map`, for a CUDA template.
pub fn map_literal(name: &str, map: &[f32; 256]) -> String {
    let values: Vec<String> = map
        .iter()
        .map(|&v| crate::codegen::build::f32_lit(v))
        .collect();
    format!(
        "__device__ const float {name}[256] = {{{}}};\n",
        values.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_maps_are_bitsandbytes_dynamic_maps() {
        let (s, u) = (signed_map(), unsigned_map());
        assert!(s.windows(2).all(|w| w[0] < w[1]) && u.windows(2).all(|w| w[0] < w[1]));
        // Signed: 127 negatives, 0, 127 positives, 1; the smallest magnitude is
        // 1e-6 * (0.1 + 1) / 2 and the largest below 1 is (0.1 + 0.9 * 127/64 ... ) / 2.
        assert_eq!((s[127], s[255], zero_code(s)), (0.0, 1.0, 127));
        assert_eq!(s[128], 5.5e-7);
        assert_eq!(s[0], -s[254]);
        assert!((s[254] - 0.992_968_75).abs() < 1e-7, "{}", s[254]);
        // Unsigned: 0, 254 positives, 1; the first exponent holds two values.
        assert_eq!((u[0], u[255], zero_code(u)), (0.0, 1.0, 0));
        assert_eq!((u[1], u[2]), (3.25e-7, 7.75e-7));
        assert!((u[254] - 0.996_484_4).abs() < 1e-7, "{}", u[254]);
    }

    #[test]
    fn nearest_code_is_the_closest_value_and_the_lower_on_ties() {
        let s = signed_map();
        for code in 0..=255u8 {
            assert_eq!(nearest(s, s[code as usize]), code);
        }
        let mid = (s[200] + s[201]) / 2.0;
        assert_eq!(nearest(s, mid), 200);
        assert_eq!(nearest(s, -1.0), 0);
        assert_eq!(nearest(s, 2.0), 255);
        assert_eq!(nearest(s, f32::NAN), 0);
        // Brute force over a sweep.
        for k in -1000..=1000 {
            let x = k as f32 / 1000.0;
            let best = (0..256)
                .min_by(|&a, &b| (s[a] - x).abs().total_cmp(&(s[b] - x).abs()))
                .unwrap_or(0);
            assert_eq!((s[nearest(s, x) as usize] - x).abs(), (s[best] - x).abs());
        }
    }

    #[test]
    fn stochastic_rounding_lands_on_a_neighbour_with_the_right_odds() {
        // 1.5 + 0.1 ulp (ulp = 2^-7 in [1, 2)): up with probability 0.1.
        let x = 1.5 + 0.1 / 128.0;
        let ups = (0..1u32 << 16)
            .filter(|&r| round_bf16_stochastic(x, r) > 1.5)
            .count();
        assert_eq!(ups, 6554, "0.1 of 65536 draws, to the draw");
        for r in [0u32, 0xffff] {
            let y = round_bf16_stochastic(-x, r);
            assert!(y == -1.5 || y == -1.5 - 1.0 / 128.0);
            assert_eq!(y.to_bits() & 0xffff, 0);
        }
        assert_eq!(round_bf16_stochastic(2.0, 0xffff), 2.0);
        assert!(round_bf16_stochastic(f32::NAN, 1).is_nan());
    }
}
