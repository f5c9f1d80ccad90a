//! Max and average pooling over NCHW and their backward ops.

mod backward;
mod cpu;
mod cuda;
mod rules;

use serde::{Deserialize, Serialize};

/// The pool family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}

/// Geometry shared by the pooling ops and their backward ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PoolParams {
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
}
