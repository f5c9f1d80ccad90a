//! CUDA lowering of the reduce ops.

use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel};
use crate::ops::cuda::CudaLowering;

impl CudaLowering for super::Family {
    fn lower(&self, args: &Args) -> Result<Kernel, CodegenError> {
        crate::codegen::ops::build_legacy(args)
    }
}
