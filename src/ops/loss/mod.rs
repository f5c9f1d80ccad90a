//! Scalar losses: mean cross-entropy over class logits and mean squared error.

mod backward;
mod cpu;
mod cuda;
mod rules;

/// The loss family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}
