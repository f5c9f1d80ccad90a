//! The stage trait for CPU reference kernels.

use crate::exec::cpu::CpuStep;
use crate::exec::ExecError;
use crate::ir::{Op, TensorType};

/// CPU kernels of a family's ops.
pub trait CpuKernel {
    /// Runs `step` over the arena views of its buffers. Errs on bad data (an id out of
    /// range), on an op that is not a step, or on an op of another family.
    fn run_cpu(&self, step: &CpuStep) -> Result<(), ExecError>;
    /// Bytes of scratch the CPU kernel of `op` needs (a workspace buffer in the arena).
    fn cpu_workspace_bytes(&self, op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64;
}

/// The error for an op handed to a family that does not hold it (a dispatch bug).
pub(crate) fn foreign_op(op: &Op, family: &str) -> ExecError {
    ExecError::Unsupported(format!(
        "internal error: `{}` is not a {family} op",
        op.name()
    ))
}
