//! Multi-head attention that never materializes scores, and rotary position embedding.

mod backward;
mod cpu;
mod cuda;
mod rules;

/// The attention family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}
