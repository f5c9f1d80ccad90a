//! The front end: `.mdl` text to a forward [`crate::ir::Graph`] plus training settings.
//! It knows nothing of petgraph; it only calls the graph builder.
pub mod ast;
mod builtins;
mod eval;
mod lower;
pub mod parallel;
mod parse;
pub mod train;
mod train_lora;
mod value;

pub use lower::{lower, Module};
pub use parse::parse;
