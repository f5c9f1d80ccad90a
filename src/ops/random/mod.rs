//! Dropout with a counter-based mask that recomputation reproduces.

mod backward;
mod cpu;
mod cuda;
mod rules;

/// The random family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}
