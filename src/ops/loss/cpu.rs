//! CPU reference kernels of the loss ops (mean cross-entropy and mean squared error, and
//! their backwards).

mod kernels;

use crate::exec::cpu::CpuStep;
use crate::exec::ExecError;
use crate::ir::{Op, TensorType};
use crate::ops::cpu::{foreign_op, CpuKernel};

impl CpuKernel for super::Family {
    fn run_cpu(&self, step: &CpuStep) -> Result<(), ExecError> {
        let x = |i| step.input(i);
        let classes = || step.shape(0).last().copied().unwrap_or(1);
        match step.op() {
            Op::CrossEntropy => kernels::cross_entropy(x(0), classes(), step.ids(1), step.output()),
            Op::CrossEntropyBackward => kernels::cross_entropy_backward(
                x(0),
                classes(),
                step.ids(1),
                x(2)[0],
                step.output(),
            ),
            Op::Mse => {
                kernels::mse(x(0), x(1), step.output());
                Ok(())
            }
            Op::MseBackward => {
                kernels::mse_backward(x(0), x(1), x(2)[0], step.output());
                Ok(())
            }
            op => Err(foreign_op(op, "loss")),
        }
    }

    fn cpu_workspace_bytes(&self, _: &Op, _: &[&TensorType], _: &TensorType) -> u64 {
        0
    }
}
