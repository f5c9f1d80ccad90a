//! Graph passes, each a pure function from one stage's value to the next.
pub mod add_norm;
pub mod arena;
pub mod autodiff;
pub mod bias_epilogue;
pub mod bias_grad_epilogue;
pub mod cast_groups;
pub mod checkpoint;
pub mod concat_grads;
pub mod freeze;
pub mod fuse_loss;
pub mod group_updates;
pub mod lce_merge;
pub mod liveness;
pub mod lora;
pub mod megatron;
pub mod norm_accumulate;
pub mod norm_backward_merge;
pub mod offload_activations;
pub mod optimizer;
pub mod packed_attention;
pub mod partition;
pub mod pipeline;
pub mod precision;
pub mod promote;
pub mod quantize;
pub mod rewrite;
pub mod saves;
pub mod schedule;
#[cfg(test)]
pub(crate) mod test_graphs;
pub mod tile;
pub mod unary_pairs;
pub mod widen;

use std::fmt;

/// An invariant a pass found broken (a compiler bug, not a user error), naming the pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageError {
    pub pass: &'static str,
    pub message: String,
}

impl StageError {
    /// An internal error raised by `pass`.
    pub fn internal(pass: &'static str, message: impl Into<String>) -> StageError {
        StageError {
            pass,
            message: message.into(),
        }
    }
}

impl fmt::Display for StageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "internal error in pass `{}`: {}",
            self.pass, self.message
        )
    }
}

impl std::error::Error for StageError {}
