//! Pipeline parallelism (GPipe's cut of the layers, PipeDream-Flush's 1F1B schedule) as a
//! rewrite of the forward graph before mixed precision and autodiff: the model's top-level
//! block instances are cut into `P` contiguous stages (`stages.rs`), and each stage's graph
//! is its part of the forward unrolled over the `M` micro-batches (`unroll.rs`), values
//! crossing stages sent and received ([`crate::ir::Op::PipelineSend`],
//! [`crate::ir::Op::PipelineRecv`]). Autodiff then gives each stage its backward for every
//! micro-batch, gradients summed over them, and the schedule runs forwards and backwards in
//! 1F1B order ([`order`]), so the arena holds the activations of exactly the micro-batches
//! in flight at the stage's peak: `min(P - s, M)` on stage `s`.

pub mod order;
mod stages;
mod unroll;

use super::megatron::SplitError;
use crate::ir::Graph;

/// The stages' forward graphs, stage 0 first; each has the output `loss`: the mean of the
/// micro-batches' losses on the last stage, the sum of its sends' scalar zeros on the others
/// (the value autodiff differentiates, whose gradient the sends' backward ignores).
#[derive(Debug, Clone)]
pub struct Stages {
    /// One forward graph per stage.
    pub graphs: Vec<Graph>,
}

/// Cuts `graph` (a forward graph with output `loss`, lowered at the micro-batch size) into
/// `stages` stages unrolled over `micro` micro-batches. Refused when the model has fewer
/// top-level block instances than stages, or a batch norm with running statistics.
pub fn run(graph: &Graph, stages: u32, micro: u32) -> Result<Stages, SplitError> {
    let assignment = stages::assign(graph, stages)?;
    let graphs = (0..stages)
        .map(|s| unroll::stage_graph(graph, &assignment, s, micro))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Stages { graphs })
}
