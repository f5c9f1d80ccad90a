//! Layer, RMS, batch and group normalization with their affine parameters.

mod backward;
mod cpu;
mod cuda;
mod rules;

pub use cuda::merged_backward_fills;
pub use rules::norm_channels;
use serde::{Deserialize, Serialize};

/// Where [`crate::ir::Op::NormBackward`]'s gradients sit in its flat output, in its
/// elements: the input gradient at 0, then each part it has 256-byte aligned after the one
/// before ([`super::packed_pair`]), the input gradient's copy last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GradsLayout {
    /// The weight gradient's offset.
    pub weight: u64,
    /// The bias gradient's offset (where it would start when there is none).
    pub bias: u64,
    /// The offset of the sum of the rounded input gradient (where it would start when there
    /// is none).
    pub sum: u64,
    /// The offset of the input gradient's copy in a narrower type (where it would start when
    /// there is none): its elements from the byte where this element starts.
    pub copy: u64,
    /// The output's length.
    pub len: u64,
}

impl GradsLayout {
    /// The layout over `rows` rows of `ch` channels in elements of `elem_bytes`, with a bias
    /// gradient when `bias`, a sum when `sum`, and a copy of the input gradient in elements
    /// of `copy_bytes` when given.
    pub fn new(
        (rows, ch, elem_bytes): (u64, u64, u64),
        bias: bool,
        sum: bool,
        copy_bytes: Option<u64>,
    ) -> GradsLayout {
        let after = |end: u64, len: Option<u64>| match len {
            Some(len) => super::packed_pair(end, len, elem_bytes),
            None => (super::packed_pair(end, 0, elem_bytes).0, end),
        };
        let (weight, end) = super::packed_pair(rows * ch, ch, elem_bytes);
        let (bias_at, end) = after(end, bias.then_some(ch));
        let (sum_at, end) = after(end, sum.then_some(ch));
        let copy_len = copy_bytes.map(|b| (rows * ch * b).div_ceil(elem_bytes.max(1)));
        let (copy_at, len) = after(end, copy_len);
        GradsLayout {
            weight,
            bias: bias_at,
            sum: sum_at,
            copy: copy_at,
            len,
        }
    }
}

/// Where [`crate::ir::Op::AddNorm`]'s norm output starts in its flat fp32 output after the
/// `elements` fp32 sums (256-byte aligned), and the output's length, for a norm output in
/// elements of `store_bytes`.
pub fn add_norm_at(elements: u64, store_bytes: u64) -> (u64, u64) {
    let at = super::packed_pair(elements, 0, 4).0;
    (at, at + (elements * store_bytes).div_ceil(4))
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
