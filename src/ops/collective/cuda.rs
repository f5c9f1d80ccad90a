//! CUDA lowering of the collectives: none. A collective is a call into NCCL between
//! devices, not a kernel, and the CUDA backend refuses plans with collectives before it
//! lowers any step (`crate::exec::cuda_can_run`): parallel plans run on the CPU backend.

use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel};
use crate::ops::cuda::CudaLowering;

impl CudaLowering for super::Family {
    fn lower(&self, a: &Args) -> Result<Kernel, CodegenError> {
        Err(CodegenError::Unsupported {
            op: a.op.name(),
            message: "a collective is a transfer between ranks, not a kernel".into(),
        })
    }
}
