//! Batched matrix products with broadcasting and optional transposes.

mod backward;
mod cpu;
mod cuda;
mod rules;

pub(crate) use cuda::GEMM_WORKSPACE;

/// The matmul family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}
