//! Layer, RMS, batch and group normalization with their affine parameters.

mod backward;
mod cpu;
mod cuda;
mod rules;

pub use cuda::merged_backward_fills;
pub use rules::norm_channels;
use serde::{Deserialize, Serialize};

/// Where [`crate::ir::Op::NormBackward`]'s gradients sit in its flat output, in elements:
/// the input gradient at 0, then each gradient it has 256-byte aligned after the one before
/// ([`super::packed_pair`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GradsLayout {
    /// The weight gradient's offset.
    pub weight: u64,
    /// The bias gradient's offset (where it would start when there is none).
    pub bias: u64,
    /// The offset of the sum of the rounded input gradient (where it would start when there
    /// is none).
    pub sum: u64,
    /// The output's length.
    pub len: u64,
}

impl GradsLayout {
    /// The layout over `rows` rows of `ch` channels in elements of `elem_bytes`, with a bias
    /// gradient when `bias` and a sum when `sum`.
    pub fn new(rows: u64, ch: u64, elem_bytes: u64, bias: bool, sum: bool) -> GradsLayout {
        let after = |end: u64, present: bool| match present {
            true => super::packed_pair(end, ch, elem_bytes),
            false => (super::packed_pair(end, ch, elem_bytes).0, end),
        };
        let (weight, end) = super::packed_pair(rows * ch, ch, elem_bytes);
        let (bias_at, end) = after(end, bias);
        let (sum_at, len) = after(end, sum);
        GradsLayout {
            weight,
            bias: bias_at,
            sum: sum_at,
            len,
        }
    }
}

/// The norm family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}

/// A normalization: which elements share statistics and which axis carries the affine
/// parameters. Layer and Rms normalize over the last axis (params sized by it); Batch
/// normalizes each channel (axis 1) over batch and space with batch statistics; Group(g)
/// normalizes each sample's groups of channels over those channels and space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormKind {
    Layer,
    Rms,
    Batch,
    Group(usize),
}
