//! CPU reference kernels of the optimizer ops: gradient clipping and accumulation, dynamic
//! loss scaling, and the in-place AdamW and SGD updates.

mod kernels;

use crate::exec::cpu::CpuStep;
use crate::exec::ExecError;
use crate::ir::{Op, TensorType};
use crate::ops::cpu::{foreign_op, CpuKernel};

impl CpuKernel for super::Family {
    fn run_cpu(&self, step: &CpuStep) -> Result<(), ExecError> {
        let x = |i| step.input(i);
        let n = step.input_count();
        match step.op() {
            Op::ClipCoefficient { max_norm, scaled } => {
                let grads = n - usize::from(*scaled);
                let m = if *scaled { f64::from(x(grads)[0]) } else { 1.0 };
                let total: f64 = (0..grads).map(|i| kernels::sum_squares(x(i))).sum();
                step.output()[0] = kernels::clip_coefficient(*max_norm, total, m);
            }
            Op::UnscaleGrads => {
                let finite = (1..n).all(|i| kernels::all_finite(x(i)));
                step.output()[0] = if finite { 1.0 / x(0)[0] } else { 0.0 };
            }
            Op::AccumulateGrad { micro_steps } => kernels::accumulate_grad(
                step.input_mut(0),
                x(1),
                *micro_steps,
                step.micro_step() == 0,
            ),
            Op::LossScaleUpdate { growth_interval } => kernels::loss_scale_update(
                &mut step.input_mut(0)[0],
                &mut step.input_mut(1)[0],
                x(2)[0],
                *growth_interval,
            ),
            // The grad-scale multiplier, when given, follows the state inputs.
            Op::AdamW(p) => kernels::adamw_update(
                step.input_mut(0),
                x(1),
                step.input_mut(2),
                step.input_mut(3),
                p,
                step.step_number(),
                if n > 4 { x(4)[0] } else { 1.0 },
            ),
            Op::Sgd(p) => kernels::sgd_update(
                step.input_mut(0),
                x(1),
                step.input_mut(2),
                p,
                step.step_number(),
                if n > 3 { x(3)[0] } else { 1.0 },
            ),
            op => return Err(foreign_op(op, "optimizer")),
        }
        Ok(())
    }

    fn cpu_workspace_bytes(&self, _: &Op, _: &[&TensorType], _: &TensorType) -> u64 {
        0
    }
}
