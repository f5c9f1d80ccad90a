//! CUDA lowering of the copies between tiers: none. A copy is not a kernel but a transfer
//! between the arena and the page-locked host arena on the CUDA backend's copy stream
//! (`crate::exec::cuda`); the code generator lowers no step that is not on the device
//! (`crate::codegen::plan_kernel_uses`), so this refusal is reached only by a direct call.

use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel};
use crate::ops::cuda::CudaLowering;

impl CudaLowering for super::Family {
    fn lower(&self, a: &Args) -> Result<Kernel, CodegenError> {
        Err(CodegenError::Unsupported {
            op: a.op.name(),
            message: "a copy between the device and the host is a transfer, not a kernel".into(),
        })
    }
}
