//! Multi-head attention that never materializes scores, and rotary position embedding.

mod backward;
mod backward_cuda;
mod backward_mma;
mod cpu;
mod cuda;
mod rules;

pub(crate) use rules::key_mask;
use serde::{Deserialize, Serialize};
use std::ops::Range;

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
/// the factor applied to q.k, the sliding window of a causal mask, the soft cap of the scores,
/// and whether a key mask is read.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AttnParams {
    pub heads: usize,
    pub kv_heads: usize,
    pub causal: bool,
    pub scale: f32,
    /// With `causal`, how many of the latest keys a query sees (itself included): Mistral's,
    /// Phi-3's and Qwen2's sliding window. At least 1; `None` sees every earlier key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<usize>,
    /// Gemma 2's attention-logit soft-capping `C` (positive): each scaled score `s` becomes
    /// `C tanh(s / C)` before the mask and the softmax. `None` leaves scores as they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub softcap: Option<f32>,
    /// Whether the op takes a fourth input, the key mask `[B, Tk]` (i32; Hugging Face's
    /// `attention_mask`): query rows of batch item `b` attend only keys `j` with
    /// `mask[b, j] != 0`, among those [`AttnParams::visible_keys`] gives. A query whose keys
    /// are all masked outputs zeros and passes no gradient. The backward ops read the mask
    /// as their fifth input, after `dout`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub key_mask: bool,
}

impl AttnParams {
    /// The keys query `i` of `t_q` queries attends among `t_k` keys, as one range: the mask's
    /// one statement, which the CPU kernels, the cost model and the CUDA backward's units
    /// call and the CUDA templates' `attn_kfirst`/`attn_kend` restate. Without `causal`,
    /// all of them. Causal (the queries aligned with the last keys), keys
    /// `j <= i + t_k - t_q`; with a window `W` also `j > i + t_k - t_q - W` (Hugging Face's
    /// rule: a key `W` or more positions back is masked). The range is empty when no key is
    /// visible, and never reaches past `t_k`.
    pub fn visible_keys(&self, i: usize, t_q: usize, t_k: usize) -> Range<usize> {
        if !self.causal {
            return 0..t_k;
        }
        let end = (i + t_k + 1).saturating_sub(t_q).min(t_k);
        let start = self.window.map_or(0, |w| end.saturating_sub(w));
        start..end
    }

    /// The score `s` (q.k already scaled) after the soft cap, if any: `C tanh(s / C)`.
    pub fn cap(&self, s: f32) -> f32 {
        self.softcap.map_or(s, |c| c * (s / c).tanh())
    }

    /// The derivative of [`AttnParams::cap`] at the scaled score `s`: `1 - tanh²(s / C)`, or
    /// 1 without a cap.
    pub fn cap_slope(&self, s: f32) -> f32 {
        self.softcap.map_or(1.0, |c| {
            let t = (s / c).tanh();
            1.0 - t * t
        })
    }

    /// How many inputs the forward op takes: q, k, v, and the key mask when there is one.
    /// Its backward ops take `dout` after these three and the key mask last.
    pub fn inputs(&self) -> usize {
        3 + usize::from(self.key_mask)
    }

    /// How many inputs the packed forward takes: the packed `x`, and the key mask when there
    /// is one. Its backward takes `dout` after `x` and the key mask last.
    pub fn packed_inputs(&self) -> usize {
        1 + usize::from(self.key_mask)
    }

    /// The number of visible (query, key) pairs of one head of one batch item: the sum of
    /// [`AttnParams::visible_keys`] over the `t_q` queries.
    pub fn visible_pairs(&self, t_q: usize, t_k: usize) -> u64 {
        (0..t_q)
            .map(|i| self.visible_keys(i, t_q, t_k).len() as u64)
            .sum()
    }
}
