//! Inputs, parameters, optimizer state and constant fills: values a step binds or keeps.

mod backward;
mod cpu;
mod cuda;
mod rules;

/// The source family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}
