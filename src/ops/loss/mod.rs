//! Scalar losses: mean cross-entropy over class logits and mean squared error; and the fused
//! loss head `linear_cross_entropy`, each row's cross-entropy of the logits `x @ w` computed
//! chunk by chunk without ever holding all of them (nor, in backward, their gradient).
//! Cross-entropy may ignore the rows whose target is one id ([`CeParams`]): they take no loss
//! and no gradient, and the mean divides by the rows kept, counted once per step by
//! `kept_count`.

mod backward;
mod cpu;
mod cuda;
mod linear_ce_cuda;
mod rules;

use serde::{Deserialize, Serialize};

/// The loss family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}

/// Which rows a cross-entropy takes, shared by the plain op, its backward, the row count and
/// the fused loss head, so that every pass and backend reads one definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct CeParams {
    /// A row whose target equals this id contributes no loss and no gradient, and the mean
    /// is over the other rows (PyTorch's `ignore_index`); `None`: every target must name a
    /// class. An ignored id may also be a valid class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_index: Option<i32>,
}

impl CeParams {
    /// Whether a row with target `t` takes part in the loss: always without an ignored id.
    pub fn keeps(&self, t: i32) -> bool {
        self.ignore_index != Some(t)
    }

    /// How many inputs a cross-entropy op with these params reads: logits and targets, then
    /// (`backward`) the loss's gradient, then with an ignored id the count of kept rows.
    pub fn inputs(&self, backward: bool) -> usize {
        2 + usize::from(backward) + usize::from(self.ignore_index.is_some())
    }
}

/// How the fused linear cross-entropy reads its weight and splits its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LinearCe {
    /// Rows of hidden states whose logits are computed at a time (at least 1): the kernels
    /// hold `chunk x V` logits in the operands' type in their workspace (the CPU as many
    /// bytes of fp32 logits), the CUDA weight gradient's tiles at most as many. The planner
    /// chooses it.
    pub chunk: usize,
    /// The weight is a `[V, D]` table read as its transpose (tied embeddings), not `[D, V]`.
    pub transposed: bool,
    /// The rows it takes: an ignored row's loss and gradients are 0.
    #[serde(default, flatten)]
    pub ce: CeParams,
}

/// Which operand a `linear_cross_entropy` backward op differentiates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LceGrad {
    /// The hidden states `x`.
    Input,
    /// The weight `w`.
    Weight,
    /// Both, in one pass that computes the logits once (`passes::lce_merge`): the output is
    /// one flat buffer of the operands' type holding the hidden states' gradient from
    /// element 0 and the weight's from [`crate::ops::packed_pair`]`.0`, each read through
    /// an `Op::Member` view.
    Both,
}

/// The fewest rows a default chunk takes, as a share of all rows: the head runs in at most
/// this many chunks of fp32 logits unless a budget halves them (16-bit logits take twice the
/// rows in the same bytes, so half as many chunks). Each chunk costs a GEMM and a kernel per
/// op (three ops) on CUDA, so chunks much smaller than this spend the step on launches and
/// on GEMMs too thin for the tensor cores (GPT-2's 132 chunks of 62 rows took 86 ms of a
/// 182 ms step on an H200).
pub const MAX_DEFAULT_CHUNKS: usize = 16;

/// The fused loss head's default chunk, between 1 and `rows`, for hidden states (and so
/// logits) of `elem_bytes` bytes: the larger of the rows whose logits (`chunk x classes`)
/// take no more than the hidden states they are computed from (`rows x dim`), and the rows
/// whose logits take the bytes of `rows / MAX_DEFAULT_CHUNKS` rows of fp32 logits (rounded
/// up).
pub fn default_chunk(rows: usize, dim: usize, classes: usize, elem_bytes: usize) -> usize {
    let within_hidden = rows.saturating_mul(dim) / classes.max(1);
    let fewest = rows
        .saturating_mul(4)
        .div_ceil(MAX_DEFAULT_CHUNKS.saturating_mul(elem_bytes).max(1));
    within_hidden.max(fewest).clamp(1, rows.max(1))
}
