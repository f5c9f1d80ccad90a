//! Max and average pooling over NCHW and their backward ops.

mod backward;
mod cpu;
mod cuda;
mod rules;

/// The pool family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}
