//! CPU reference kernel of the source ops: `Fill` writes its constant; inputs, parameters
//! and optimizer state are bound or initialized by the executor and are never steps.

use crate::exec::cpu::CpuStep;
use crate::exec::kernels::layout::CHUNK;
use crate::exec::ExecError;
use crate::ir::{Op, TensorType};
use crate::ops::cpu::{foreign_op, CpuKernel};
use rayon::prelude::*;

impl CpuKernel for super::Family {
    fn run_cpu(&self, step: &CpuStep) -> Result<(), ExecError> {
        match step.op() {
            Op::Fill { value, .. } => {
                fill(step.output(), *value);
                Ok(())
            }
            op @ (Op::Input { .. } | Op::Param { .. } | Op::OptimState { .. }) => Err(
                ExecError::Unsupported(format!("`{}` is not a step", op.name())),
            ),
            op => Err(foreign_op(op, "source")),
        }
    }

    fn cpu_workspace_bytes(&self, _: &Op, _: &[&TensorType], _: &TensorType) -> u64 {
        0
    }
}

/// Sets every element of `out` to `value`.
fn fill(out: &mut [f32], value: f32) {
    out.par_chunks_mut(CHUNK).for_each(|o| o.fill(value));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_sets_every_element() {
        let mut big = vec![1.0; 10_000];
        fill(&mut big, -4.5);
        assert!(big.iter().all(|&v| v == -4.5));
    }
}
