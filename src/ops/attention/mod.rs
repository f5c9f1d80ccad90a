//! Multi-head attention that never materializes scores, and rotary position embedding.

mod backward;
mod backward_cuda;
mod cpu;
mod cuda;
mod rules;

use serde::{Deserialize, Serialize};

/// The attention family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}

/// Which input of attention a backward node differentiates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AttnInput {
    Q,
    K,
    V,
}

/// Attention configuration: heads of q, heads of k/v (grouped-query when fewer), causal mask,
/// and the factor applied to q.k.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AttnParams {
    pub heads: usize,
    pub kv_heads: usize,
    pub causal: bool,
    pub scale: f32,
}
