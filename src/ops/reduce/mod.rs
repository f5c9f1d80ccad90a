//! Sums and maxima over broadcast dims, and broadcasting back.

mod backward;
mod cpu;
mod cuda;
mod rules;

/// The reduce family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}
