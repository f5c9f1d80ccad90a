//! Weight-only quantized storage of frozen weights (QLoRA-style): a frozen 2-D weight read
//! only by matmuls is stored packed in one byte buffer (`u8`), and `Dequantize` turns it
//! into the compute-precision weight the matmul reads, as bitsandbytes dequantizes a 4-bit
//! weight before its GEMM. Packing happens on the host when parameters are written
//! ([`pack`]); dequantization is exact arithmetic on the stored codes, so the CPU kernel and
//! the CUDA kernel give the same bits.

mod backward;
mod cpu;
mod cuda;
pub mod pack;
mod rules;

use serde::{Deserialize, Serialize};
use std::fmt;

/// The quantization family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}

/// How a frozen weight is quantized (`--quantize-frozen`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scheme {
    /// LLM.int8()'s vector-wise weight quantization: one int8 code per weight and one f32
    /// absmax scale per output channel.
    Int8,
    /// QLoRA's 4-bit NormalFloat: blocks of 64 weights with a double-quantized absmax.
    Nf4,
}

impl Scheme {
    /// Every scheme, in the order the command line lists them.
    pub const ALL: [Scheme; 2] = [Scheme::Int8, Scheme::Nf4];

    /// Parses the command line's spelling (`int8`, `nf4`).
    pub fn parse(text: &str) -> Option<Scheme> {
        Scheme::ALL.into_iter().find(|s| s.to_string() == text)
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scheme::Int8 => "int8",
            Scheme::Nf4 => "nf4",
        })
    }
}

/// A quantized weight: its scheme, its shape as stored (`[in, out]` read `x @ W`, or
/// `[out, in]` read `x @ W^T`) and which of the two axes indexes output channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Quantized {
    pub scheme: Scheme,
    pub shape: [usize; 2],
    /// 0 when rows are output channels (`[out, in]`), 1 when columns are (`[in, out]`).
    pub out_axis: usize,
}

impl Quantized {
    /// The number of weights.
    pub fn numel(&self) -> u64 {
        self.shape[0] as u64 * self.shape[1] as u64
    }

    /// The number of output channels (int8 keeps one scale per channel).
    pub fn channels(&self) -> u64 {
        self.shape[self.out_axis.min(1)] as u64
    }

    /// Bytes of the packed buffer ([`pack::Layout`]); always a multiple of 4.
    pub fn packed_bytes(&self) -> u64 {
        pack::Layout::of(self).bytes
    }
}
