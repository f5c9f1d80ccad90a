//! The stage trait for CUDA lowering.

use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel};
use crate::ir::{Op, TensorType};

/// CUDA lowering of a family's ops.
pub trait CudaLowering {
    /// The kernel (template, constants, launch geometry) computing `args.op`.
    fn lower(&self, args: &Args) -> Result<Kernel, CodegenError>;
    /// Bytes of scratch the kernel of `op` reads and writes (a workspace buffer in the arena,
    /// passed as [`crate::codegen::KernelParam::Workspace`]); 0, the default, when it takes
    /// none.
    fn cuda_workspace_bytes(&self, _op: &Op, _inputs: &[&TensorType], _out: &TensorType) -> u64 {
        0
    }
}
