//! CPU kernel primitives shared by several op families (each family's own kernels live in
//! `src/ops/<family>/cpu/`): the GEMM of matmul and convolution, shape/stride helpers and
//! parallel loops, the softmax shared by the softmax family and cross-entropy, the
//! counter-based RNG of dropout, parameter initialization and synthetic inputs, the id range
//! check of embedding and cross-entropy, and the reduce kernels, whose public path the CUDA
//! comparison tests use.
pub(crate) mod gemm;
pub(crate) mod layout;
pub mod reduce;
pub mod rng;
pub(crate) mod softmax;
#[cfg(test)]
pub(crate) mod testing;

use super::ExecError;
use crate::ir::{Op, TensorType};

/// Bytes of scratch the CPU kernel of `op` needs, placed in the arena as a workspace buffer.
pub fn workspace_bytes(op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
    crate::ops::family(op).cpu_workspace_bytes(op, inputs, out)
}

/// Checks that every id (class target or embedding row) lies in `0..limit`, or reports the
/// first that does not.
pub(crate) fn check_ids(ids: &[i32], limit: usize) -> Result<(), ExecError> {
    match ids
        .iter()
        .find(|&&v| usize::try_from(v).map_or(true, |u| u >= limit))
    {
        Some(&v) => Err(ExecError::IdOutOfRange {
            value: i64::from(v),
            limit,
        }),
        None => Ok(()),
    }
}
