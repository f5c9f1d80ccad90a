//! Conversion between float precisions (round to nearest even when narrowing).

mod backward;
mod cpu;
mod cuda;
mod rules;

/// The cast family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}
