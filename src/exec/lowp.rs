//! fp16/bf16 storage for the CPU backend: the executor keeps 16-bit tensors at their planned
//! offsets as raw 16-bit words and computes in fp32. Decoding is exact; encoding rounds to
//! nearest even (NaN stays NaN, overflow becomes inf), as the CUDA kernels' stores do
//! (`__float2half_rn`, `__float2bfloat16_rn`), so CPU results predict GPU ones.

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
        DType::F32 | DType::I32 => x,
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
}
