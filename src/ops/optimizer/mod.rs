//! Optimizer updates and the reductions they need: clipping, loss scaling, accumulation.

mod backward;
mod cpu;
mod cuda;
mod rules;

/// The optimizer family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}
