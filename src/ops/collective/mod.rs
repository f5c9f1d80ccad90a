//! Collectives between the data-parallel ranks of a plan (`parallel = (data = N, zero = K)`):
//! the mean of the ranks' gradients (`all_reduce`), each rank's slice of it
//! (`reduce_scatter`), every rank's shard put together (`all_gather`, `all_gather_into`), and
//! a rank's own slice of a replicated value (`shard`); between the tensor-parallel ranks of
//! a replica, Megatron's `f` (`tensor_copy`) and `g` (`tensor_reduce`, their sum). Sums run
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
