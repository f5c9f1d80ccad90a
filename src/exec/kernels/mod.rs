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

/// Checks that every id (class target or embedding row) but the `ignored` one lies in
/// `0..limit`, or reports the first that does not.
pub(crate) fn check_ids(ids: &[i32], limit: usize, ignored: Option<i32>) -> Result<(), ExecError> {
    match ids
        .iter()
        .find(|&&v| Some(v) != ignored && usize::try_from(v).map_or(true, |u| u >= limit))
    {
        Some(&v) => Err(ExecError::IdOutOfRange {
            value: i64::from(v),
            limit,
        }),
        None => Ok(()),
    }
}
