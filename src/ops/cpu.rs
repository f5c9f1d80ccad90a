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

/// The two tensors of a flat output that packs a first of `first` elements and a second of
/// `second` as [`crate::ops::packed_pair`] lays them out (elements of `elem_bytes` bytes),
/// with the gap between them zeroed.
pub(crate) fn packed_pair_mut(
    out: &mut [f32],
    (first, second): (usize, usize),
    elem_bytes: u64,
) -> (&mut [f32], &mut [f32]) {
    let (at, _) = super::packed_pair(first as u64, second as u64, elem_bytes);
    let (a, rest) = out.split_at_mut(first);
    let (gap, b) = rest.split_at_mut(at as usize - first);
    gap.fill(0.0);
    (a, &mut b[..second])
}
