//! CUDA lowering of the copies between tiers: none. A copy is not a kernel but a transfer
//! between the arena and pinned host memory, and the CUDA backend refuses plans with a host
//! tier before it lowers any step (`crate::exec::cuda_can_run`).

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
