//! Element types of tensors and their sizes.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The element type of a tensor. Floating types hold activations and parameters; `I32` holds
/// integer inputs (token ids, class targets) and never carries a gradient; `U8` holds raw
/// bytes (a quantized weight's packed buffer, `crate::ops::quant::pack`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    F16,
    BF16,
    I32,
    /// One unsigned byte: 8-bit codes (AdamW's quantized moments, a quantized weight's packed
    /// bytes), not a number to compute on.
    U8,
}

impl DType {
    /// Bytes one element occupies in memory.
    pub fn size(self) -> u64 {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U8 => 1,
        }
    }

    /// True for the floating types (the ones autodiff differentiates).
    pub fn is_float(self) -> bool {
        !matches!(self, DType::I32 | DType::U8)
    }

    /// Parses the surface spelling (`f32`, `f16`, `bf16`, `i32`, `u8`).
    pub fn parse(text: &str) -> Option<DType> {
        match text {
            "f32" => Some(DType::F32),
            "f16" => Some(DType::F16),
            "bf16" => Some(DType::BF16),
            "i32" => Some(DType::I32),
            "u8" => Some(DType::U8),
            _ => None,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::U8 => "u8",
        })
    }
}
