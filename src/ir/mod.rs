//! memc's one IR: a graph of tensor ops.
//!
//! A [`Graph`] is a list of nodes; each node applies an [`Op`] to earlier nodes' values and
//! produces one value of a static [`TensorType`] (dtype and row-major shape). Values are
//! immutable, with one exception: optimizer updates write a parameter and its state in
//! place, and output an empty tensor. Every node keeps the span of the `.mdl` text it came
//! from, the block scope it was created in, and the phase (forward, backward, update) of the
//! step it belongs to. Creation order is a topological order; the execution order chosen by
//! the scheduler is a separate value. Shapes are concrete: dims are resolved in the front end.

pub mod cost;
mod dtype;
mod graph;
pub mod infer;
mod op;
mod print;
mod types;
mod verify;

pub use dtype::DType;
pub use graph::{Graph, Node, Origin, Phase, ValueId};
pub use infer::TypeError;
pub use op::*;
pub use print::print;
pub use types::{broadcast, normalize_axis, numel, ShapeDisplay, Span, TensorType};
pub use verify::{verify, VerifyError};
