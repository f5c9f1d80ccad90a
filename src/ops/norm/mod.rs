//! Layer, RMS, batch and group normalization with their affine parameters.

mod backward;
mod cpu;
mod cuda;
mod rules;

/// The norm family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}
