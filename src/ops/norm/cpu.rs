//! CPU reference kernels of the norm ops (layer, RMS, batch and group normalization and
//! their input, weight and bias backwards, and batch norm's running statistics).

mod kernels;

use crate::exec::cpu::CpuStep;
use crate::exec::ExecError;
use crate::ir::{Op, TensorType};
use crate::ops::cpu::{foreign_op, CpuKernel};

impl CpuKernel for super::Family {
    fn run_cpu(&self, step: &CpuStep) -> Result<(), ExecError> {
        let (x, s) = (|i| step.input(i), step.shape(0));
        match step.op() {
            Op::Norm { kind, eps, .. } => {
                let bias = (step.input_count() > 2).then(|| x(2));
                kernels::norm_forward(*kind, *eps, x(0), s, x(1), bias, step.output())
            }
            Op::NormBackwardInput { kind, eps } => {
                let dx = step.output();
                kernels::norm_backward_input(*kind, *eps, x(0), s, x(1), x(2), dx);
                if step.input_count() > 3 {
                    kernels::accumulate(dx, x(3));
                }
            }
            Op::NormBackwardWeight { kind, eps } => {
                kernels::norm_backward_weight(*kind, *eps, x(0), s, x(1), step.output())
            }
            Op::NormBackwardBias { kind } => {
                kernels::norm_backward_bias(*kind, x(0), s, step.output())
            }
            Op::BatchNormStats { momentum } => kernels::batch_norm_stats(
                *momentum,
                x(2),
                step.shape(2),
                step.input_mut(0),
                step.input_mut(1),
            ),
            op => return Err(foreign_op(op, "norm")),
        }
        Ok(())
    }

    fn cpu_workspace_bytes(&self, _: &Op, _: &[&TensorType], _: &TensorType) -> u64 {
        0
    }
}
