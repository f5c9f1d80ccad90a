//! 2-D convolution (groups, stride, padding, dilation) and its backward ops.

mod backward;
mod cpu;
mod cuda;
mod rules;

use serde::{Deserialize, Serialize};

/// The conv family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}

/// Geometry shared by conv2d and its backward ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConvParams {
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
}
