//! fp16/bf16 storage for the CPU backend: the executor keeps 16-bit tensors at their planned
//! offsets as raw 16-bit words and computes in fp32. Decoding is exact; encoding rounds to
//! nearest even (NaN stays NaN, overflow becomes inf), as the CUDA kernels' stores do
//! (`__float2half_rn`, `__float2bfloat16_rn`), so CPU results predict GPU ones. u8 codes are
//! staged as their integer values in f32, which holds each exactly.

use crate::ir::DType;
use half::{bf16, f16};

/// The fp32 value of a stored 16-bit word of `dtype` (f16 or bf16).
pub fn decode(dtype: DType, word: u16) -> f32 {
    match dtype {
        DType::BF16 => bf16::from_bits(word).to_f32(),
        _ => f16::from_bits(word).to_f32(),
    }
}

/// The 16-bit word of `dtype` (f16 or bf16) nearest to `x`.
pub fn encode(dtype: DType, x: f32) -> u16 {
    match dtype {
        DType::BF16 => bf16::from_f32(x).to_bits(),
        _ => f16::from_f32(x).to_bits(),
    }
}

/// `x` rounded to `dtype` and back: what storing it in a tensor of that type keeps.
pub fn round(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::F16 | DType::BF16 => decode(dtype, encode(dtype, x)),
        DType::U8 => f32::from(code(x)),
        DType::F32 | DType::I32 => x,
    }
}

/// The u8 code an f32-staged value stands for: its integer part, saturated to 0..=255 (NaN 0).
fn code(x: f32) -> u8 {
    x as u8
}

/// `values` stored as `dtype`, little-endian: 16-bit floats rounded to nearest even; f32 as
/// is, and i32 ids (which arrive as their bit patterns) likewise; u8 codes one byte each.
pub fn to_bytes(dtype: DType, values: &[f32]) -> Vec<u8> {
    match dtype {
        DType::U8 => values.iter().map(|&v| code(v)).collect(),
        DType::F16 | DType::BF16 => values
            .iter()
            .flat_map(|&v| encode(dtype, v).to_le_bytes())
            .collect(),
        DType::F32 | DType::I32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// The f32 values of little-endian `bytes` stored as `dtype` (the inverse of [`to_bytes`]).
pub fn from_bytes(dtype: DType, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        DType::U8 => bytes.iter().map(|&b| f32::from(b)).collect(),
        DType::F16 | DType::BF16 => bytes
            .chunks_exact(2)
            .map(|c| decode(dtype, u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        DType::F32 | DType::I32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    }
}

/// Writes `values` encoded in `dtype` into the bytes of `out`, the elements of an fp32
/// buffer, as the arena holds them (a narrower part of a flat fp32 output); bytes past the
/// values in the last element are 0. `out` must hold the encoded bytes.
pub fn pack(dtype: DType, values: &[f32], out: &mut [f32]) {
    let bytes = to_bytes(dtype, values);
    for (o, c) in out.iter_mut().zip(bytes.chunks(4)) {
        let mut word = [0u8; 4];
        word[..c.len()].copy_from_slice(c);
        *o = f32::from_le_bytes(word);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_to_nearest_even_and_saturates_to_inf() {
        // 1 + 2^-8 lies halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to even (1).
        assert_eq!(round(DType::BF16, 1.0 + 1.0 / 256.0), 1.0);
        assert_eq!(round(DType::BF16, 1.0 + 3.0 / 256.0), 1.0 + 4.0 / 256.0);
        assert_eq!(round(DType::F16, 65504.0), 65504.0);
        assert_eq!(round(DType::F16, 70000.0), f32::INFINITY);
        assert!(round(DType::F16, f32::NAN).is_nan());
        assert_eq!(round(DType::F16, 1.0 + 1.0 / 2048.0), 1.0);
        assert_eq!(decode(DType::BF16, encode(DType::BF16, -3.5)), -3.5);
    }

    #[test]
    fn bytes_round_trip_in_every_dtype() {
        let values = [1.5f32, -2.0, 0.0, 65504.0];
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let bytes = to_bytes(dtype, &values);
            assert_eq!(bytes.len() as u64, values.len() as u64 * dtype.size());
            assert_eq!(from_bytes(dtype, &bytes), values.map(|v| round(dtype, v)));
        }
        let codes = [0.0f32, 7.0, 255.0];
        assert_eq!(from_bytes(DType::U8, &to_bytes(DType::U8, &codes)), codes);
        assert_eq!(to_bytes(DType::U8, &[-1.0, 300.0, f32::NAN]), [0, 255, 0]);
        let id = f32::from_bits(7);
        assert_eq!(
            from_bytes(DType::I32, &to_bytes(DType::I32, &[id]))[0].to_bits(),
            7
        );
    }
}
