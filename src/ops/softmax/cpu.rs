//! CPU reference kernels of the softmax ops (softmax and log-softmax along an axis, and
//! their backward from the forward output).

mod kernels;

use crate::exec::cpu::CpuStep;
use crate::exec::kernels::softmax::softmax;
use crate::exec::ExecError;
use crate::ir::{Op, TensorType};
use crate::ops::cpu::{foreign_op, CpuKernel};

impl CpuKernel for super::Family {
    fn run_cpu(&self, step: &CpuStep) -> Result<(), ExecError> {
        let (x, s) = (|i| step.input(i), step.shape(0));
        match step.op() {
            Op::Softmax { axis } => softmax(x(0), s, *axis, step.output()),
            Op::SoftmaxBackward { axis } => {
                kernels::softmax_backward(x(0), x(1), s, *axis, step.output())
            }
            Op::LogSoftmax { axis } => kernels::log_softmax(x(0), s, *axis, step.output()),
            Op::LogSoftmaxBackward { axis } => {
                kernels::log_softmax_backward(x(0), x(1), s, *axis, step.output())
            }
            op => return Err(foreign_op(op, "softmax")),
        }
        Ok(())
    }

    fn cpu_workspace_bytes(&self, _: &Op, _: &[&TensorType], _: &TensorType) -> u64 {
        0
    }
}
