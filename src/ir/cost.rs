//! FLOP counts per op (multiply-add = 2), for the report and recomputation trade-offs.

use super::{Op, TensorType};

/// FLOPs of one execution of `op` on inputs of the given types producing `out`, by its
/// family's rule.
pub fn flops(op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
    crate::ops::family(op).flops(op, inputs, out)
}
