//! Collectives between the data-parallel ranks of a plan (`parallel = (data = N, zero = K)`):
//! the mean of the ranks' gradients (`all_reduce`), each rank's slice of it
//! (`reduce_scatter`), every rank's shard put together (`all_gather`, `all_gather_into`), and
//! a rank's own slice of a replicated value (`shard`); between the tensor-parallel ranks of
//! a replica, Megatron's `f` (`tensor_copy`) and `g` (`tensor_reduce`, their sum); between
//! the pipeline stages of a replica, a value sent (`pipeline_send`) and received
//! (`pipeline_recv`) under a [`PipeLink`]. Sums run
//! in rank order, so every rank computes the same bits; shards are `ceil(numel / ranks)`
//! elements, the last zero-padded.

mod backward;
mod cpu;
mod cuda;
mod rules;

/// The collective family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}

/// Elements in each rank's shard of `numel` elements over `ranks` ranks (the last padded).
pub fn shard_len(numel: u64, ranks: u32) -> u64 {
    numel.div_ceil(u64::from(ranks.max(1)))
}

/// What a pipeline send or receive exchanges: value `value` (its id in the model's forward
/// graph) of micro-batch `micro`, or its gradient, with stage `peer`. A send and a receive
/// meet when their stages name each other and the rest is equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct PipeLink {
    /// The other stage, 0-based.
    pub peer: u32,
    /// The micro-batch, 0-based.
    pub micro: u32,
    /// The value's id in the forward graph the stages were cut from.
    pub value: u32,
    /// Whether the message is the value's gradient (flowing back) rather than the value.
    pub gradient: bool,
}

impl PipeLink {
    /// The link of the gradient of this link's value, with the same peer.
    pub fn gradient(self) -> PipeLink {
        PipeLink {
            gradient: true,
            ..self
        }
    }
}
