//! Batched matrix products with broadcasting and optional transposes.

mod backward;
mod cpu;
mod cuda;
mod rules;

pub(crate) use cuda::GEMM_WORKSPACE;

/// The matmul family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}

/// Where the bias gradient of an [`crate::ir::Op::MatMulBiasGrad`] with `product` elements
/// starts, in elements: the product's count rounded up to 128, so the sums start 256 bytes
/// aligned in any element type of 2 bytes or more and the layout is the same in every type.
pub(crate) fn bias_grad_offset(product: u64) -> u64 {
    product.div_ceil(128) * 128
}
