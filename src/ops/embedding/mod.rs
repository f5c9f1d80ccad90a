//! Row lookup in a table by integer ids, and its scatter-add backward.

mod backward;
mod cpu;
mod cuda;
mod rules;

/// The embedding family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}
