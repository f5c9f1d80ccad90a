//! CPU reference kernels of the reduce ops; the kernels themselves live in
//! [`crate::exec::kernels::reduce`], a public path the CUDA comparison tests use.

use crate::exec::cpu::CpuStep;
use crate::exec::kernels::reduce::{broadcast_to, max_to, max_to_backward, sum_to};
use crate::exec::ExecError;
use crate::ir::{Op, TensorType};
use crate::ops::cpu::{foreign_op, CpuKernel};

impl CpuKernel for super::Family {
    fn run_cpu(&self, step: &CpuStep) -> Result<(), ExecError> {
        let (x, s) = (|i| step.input(i), |i| step.shape(i));
        match step.op() {
            Op::SumTo { shape, .. } => sum_to(x(0), s(0), step.output(), shape),
            Op::BroadcastTo { shape } => broadcast_to(x(0), s(0), step.output(), shape),
            Op::MaxTo { shape } => max_to(x(0), s(0), step.output(), shape),
            Op::MaxToBackward => max_to_backward(x(0), s(0), x(1), x(2), step.output(), s(1)),
            op => return Err(foreign_op(op, "reduce")),
        }
        Ok(())
    }

    fn cpu_workspace_bytes(&self, _: &Op, _: &[&TensorType], _: &TensorType) -> u64 {
        0
    }
}
