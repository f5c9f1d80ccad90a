//! Round trips of both schemes on known values, and their error bounds.

use super::*;
use crate::exec::kernels::rng;

fn q(scheme: Scheme, shape: [usize; 2], out_axis: usize) -> Quantized {
    Quantized {
        scheme,
        shape,
        out_axis,
    }
}

fn normal(n: usize, key: u64) -> Vec<f32> {
    (0..n as u64)
        .map(|i| rng::normal01(key, 0, i) * 0.02)
        .collect()
}

#[test]
fn nf4_levels_are_bitsandbytes_values() {
    let published = [
        -1.0,
        -0.6961928009986877,
        -0.5250730514526367,
        -0.39491748809814453,
        -0.28444138169288635,
        -0.18477343022823334,
        -0.09105003625154495,
        0.0,
        0.07958029955625534,
        0.16093020141124725,
        0.24611230194568634,
        0.33791524171829224,
        0.44070982933044434,
        0.5626170039176941,
        0.7229568362236023,
        1.0,
    ];
    for (level, want) in NF4.iter().zip(published) {
        assert_eq!(*level, want as f32);
    }
    for (k, &level) in NF4.iter().enumerate() {
        assert_eq!(nf4_code(level), k as u8);
    }
}

#[test]
fn layouts_have_the_stated_sizes() {
    let w = q(Scheme::Int8, [3, 5], 0);
    assert_eq!(w.packed_bytes(), 16 + 4 * 3);
    assert_eq!(q(Scheme::Int8, [3, 5], 1).packed_bytes(), 16 + 4 * 5);
    // 4096 x 4096: 8,388,608 code bytes, 262,144 absmax codes, 1,024 scales and the mean.
    let big = q(Scheme::Nf4, [4096, 4096], 0);
    assert_eq!(big.packed_bytes(), 8_388_608 + 262_144 + 4 * 1_025);
    let per_weight = big.packed_bytes() as f64 / big.numel() as f64;
    assert!((per_weight - 0.516).abs() < 1e-3, "{per_weight}");
    assert_eq!(q(Scheme::Nf4, [3, 7], 0).packed_bytes(), 12 + 4 + 4 + 4);
}

#[test]
fn int8_round_trips_known_values_exactly() {
    // Row absmaxes 127 and 2.54: scales 1 and 0.02; columns as output channels likewise.
    let w = q(Scheme::Int8, [2, 3], 0);
    let values = [127.0, -64.0, 1.0, 0.0, 0.0, 0.0];
    let bytes = pack(&w, &values).expect("packs");
    assert_eq!(&bytes[..6], &[127, 192, 1, 0, 0, 0]);
    assert_eq!(unpack(&w, &bytes), values);
    let cols = q(Scheme::Int8, [2, 2], 1);
    let bytes = pack(&cols, &[-127.0, 2.0, 63.5, 254.0]).expect("packs");
    assert_eq!(&bytes[..4], &[129, 1, 64, 127]);
    assert!(pack(&cols, &[1.0]).is_err());
}

#[test]
fn int8_error_is_within_half_a_step_per_channel() {
    for out_axis in [0, 1] {
        let w = q(Scheme::Int8, [37, 70], out_axis);
        let values = normal(37 * 70, 3 + out_axis as u64);
        let back = unpack(&w, &pack(&w, &values).expect("packs"));
        let mut absmax = vec![0f32; w.channels() as usize];
        for (i, v) in values.iter().enumerate() {
            let c = if out_axis == 0 { i / 70 } else { i % 70 };
            absmax[c] = absmax[c].max(v.abs());
        }
        for (i, (v, d)) in values.iter().zip(&back).enumerate() {
            let c = if out_axis == 0 { i / 70 } else { i % 70 };
            let bound = absmax[c] / 127.0 / 2.0 * (1.0 + 1e-5);
            assert!((v - d).abs() <= bound, "{i}: {v} -> {d} (bound {bound})");
        }
    }
}

#[test]
fn nf4_round_trips_known_values() {
    // One block whose absmax is 2: the levels times 2 come back exactly (a single block's
    // absmax equals the mean, so its double-quantized code is 0 and a = m exactly).
    let w = q(Scheme::Nf4, [2, 8], 0);
    let values: Vec<f32> = NF4.iter().map(|l| l * 2.0).collect();
    let bytes = pack(&w, &values).expect("packs");
    assert_eq!(bytes[0], 0x01);
    assert_eq!(bytes[7], 0xef);
    assert_eq!(unpack(&w, &bytes), values);
}

#[test]
fn nf4_error_is_within_the_half_gap_plus_the_double_quantization() {
    // 300 blocks over two absmax groups, with blocks of very different scales.
    let w = q(Scheme::Nf4, [300, 64], 0);
    let mut values = normal(300 * 64, 11);
    for (i, v) in values.iter_mut().enumerate() {
        *v *= 1.0 + (i / 64 % 7) as f32;
    }
    let bytes = pack(&w, &values).expect("packs");
    let back = unpack(&w, &bytes);
    let layout = Layout::of(&w);
    let scale = |g: usize| get_f32(&bytes, layout.scales + 4 * g as u64);
    for (b, block) in values.chunks(NF4_BLOCK).enumerate() {
        let absmax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let double = scale(b / ABSMAX_GROUP) / 2.0;
        for (k, &v) in block.iter().enumerate() {
            let x = v / absmax;
            let up = NF4.partition_point(|&l| l < x).min(15);
            let gap = NF4[up] - NF4[up.saturating_sub(1)];
            let bound = gap / 2.0 * absmax + double + 1e-6 * absmax;
            let d = back[b * NF4_BLOCK + k];
            assert!(
                (v - d).abs() <= bound,
                "{b}/{k}: {v} -> {d} (bound {bound})"
            );
        }
    }
    let sums = ErrorSums::of(&w, &values, &bytes);
    assert!(sums.rms_relative() > 0.01 && sums.rms_relative() < 0.15);
    assert_eq!(sums.packed_bytes, w.packed_bytes());
}
