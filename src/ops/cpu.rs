//! The stage trait for CPU reference kernels.

use crate::exec::cpu::{CpuExecutor, Views};
use crate::exec::ExecError;
use crate::ir::{Op, TensorType};
use crate::plan::Step;

/// CPU kernels of a family's ops.
pub trait CpuKernel {
    /// Runs `step` over the arena views of its buffers.
    fn run_cpu(&self, exec: &CpuExecutor, step: &Step, views: &Views) -> Result<(), ExecError>;
    /// Bytes of scratch the CPU kernel of `op` needs (a workspace buffer in the arena).
    fn cpu_workspace_bytes(&self, op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64;
}
