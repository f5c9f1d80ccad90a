//! Shape and dtype inference: the type of an op's output from its inputs' types, or why the
//! inputs are invalid for it. The graph builder, the graph and plan verifiers and the CUDA
//! generator all call [`infer`]; each family's rule lives in `src/ops/<family>/rules.rs`.

use super::{Op, TensorType};

pub use crate::ops::norm::norm_channels;
pub use crate::ops::rules::window_out;

/// Why an op cannot take the given inputs; `message` names the offending shapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeError {
    pub message: String,
    pub help: String,
}

/// The output type of `op` applied to inputs of the given types, by its family's rule.
pub fn infer(op: &Op, inputs: &[&TensorType]) -> Result<TensorType, TypeError> {
    crate::ops::family(op).infer(op, inputs)
}
