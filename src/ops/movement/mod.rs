//! Data movement: reshape, permute, slice, pad and concatenation.

mod backward;
mod cpu;
mod cuda;
mod rules;

/// The movement family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}
