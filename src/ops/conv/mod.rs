//! 2-D convolution (groups, stride, padding, dilation) and its backward ops.

mod backward;
mod cpu;
mod cuda;
mod rules;

/// The conv family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}
