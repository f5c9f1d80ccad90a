//! The stage trait for shape and dtype rules, costs and precision classes.

use crate::ir::{Op, OpClass, TensorType, TypeError};

/// In which precision an op runs under automatic mixed precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrecisionClass {
    /// In the low precision (bf16 or fp16); the kernel accumulates in fp32.
    Low,
    /// In fp32.
    Fp32,
    /// In the widest precision among its inputs that depend on a step input.
    Widest,
    /// Reads its inputs as they are: the kernel computes in fp32 and returns fp32.
    AsIs,
}

/// Type rule, cost and precision class of a family's ops.
pub trait Rules {
    /// The output type of `op` on inputs of the given types, or why they are ill-typed.
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<TensorType, TypeError>;
    /// FLOPs of one execution of `op` (multiply-add = 2).
    fn flops(&self, op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64;
    /// The precision `op` runs in under mixed precision.
    fn precision(&self, op: &Op) -> PrecisionClass;
    /// What kind of work `op` is, for cost models and recomputation policy.
    fn class(&self, op: &Op) -> OpClass;
    /// Indices of inputs `op` overwrites in place.
    fn mutated_inputs(&self, op: &Op) -> &'static [usize];
}
