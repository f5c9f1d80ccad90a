//! Elementwise unary and binary functions and affine maps, with broadcasting.

mod backward;
mod cpu;
mod cuda;
mod rules;

/// The pointwise family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}
