//! The stage trait for CUDA lowering.

use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel};

/// CUDA lowering of a family's ops.
pub trait CudaLowering {
    /// The kernel (template, constants, launch geometry) computing `args.op`.
    fn lower(&self, args: &Args) -> Result<Kernel, CodegenError>;
}
