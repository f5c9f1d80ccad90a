//! A pipeline stage's place in its plan (`Plan::pipeline`): which stage of how many, the
//! micro-batches, and what a stage's executor needs to start as one rank with the whole
//! model would (the position of each parameter among the model's, the model's inputs in
//! order).

use serde::{Deserialize, Serialize};

/// Where a stage's plan sits in the pipeline. Stage 0's plan carries the other stages'
/// plans (`Plan::stages`), each with its own `PipelineStage`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipelineStage {
    /// This stage, 0-based.
    pub stage: u32,
    /// Stages in the pipeline.
    pub stages: u32,
    /// Micro-batches per step.
    pub microbatches: u32,
    /// For each of this plan's parameters (`Plan::params`, by index), its position among
    /// the whole model's parameters (running statistics not counted), which keys its
    /// initial values.
    pub positions: Vec<u64>,
    /// The model's inputs in declaration order, whose index keys each input's synthetic
    /// values (a stage binds every input, whole, and slices its micro-batches' rows).
    pub inputs: Vec<String>,
}

impl PipelineStage {
    /// The index among the model's inputs of the input named `name` (its position in this
    /// plan's inputs when the model's list does not name it).
    pub fn input_index(&self, name: &str, fallback: usize) -> usize {
        self.inputs
            .iter()
            .position(|n| n == name)
            .unwrap_or(fallback)
    }
}
