//! CPU reference kernels of the optimizer ops: gradient clipping and accumulation, dynamic
//! loss scaling, and the in-place AdamW (fp32 or 8-bit moments) and SGD updates.

mod kernels;
mod quantized;

use crate::exec::cpu::CpuStep;
use crate::exec::ExecError;
use crate::ir::{Op, TensorType};
use crate::ops::cpu::{foreign_op, CpuKernel};
use crate::ops::optimizer::StateFormat;

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
            Op::AdamW(p) => {
                let states = super::adamw_states(p.state);
                let scale = if n > 2 + states {
                    x(2 + states)[0]
                } else {
                    1.0
                };
                let t = kernels::AdamWStep::new(p, step.step_number(), scale);
                let store = kernels::Store::new(p.rounding, step.dropout_stream());
                match p.state {
                    StateFormat::Fp32 => kernels::adamw_update(
                        step.input_mut(0),
                        x(1),
                        step.input_mut(2),
                        step.input_mut(3),
                        &t,
                        store,
                    ),
                    StateFormat::Int8 => {
                        let moment = |codes, absmax| quantized::Quantized {
                            codes: step.input_mut(codes),
                            absmax: step.input_mut(absmax),
                        };
                        let moments = (moment(2, 4), moment(3, 5));
                        quantized::adamw8_update(step.input_mut(0), x(1), moments, &t, store)
                    }
                }
            }
            // Each parameter of a group exactly as its own AdamW step.
            Op::AdamWGroup { hyper, tensors } => {
                let quads = 4 * *tensors as usize;
                let scale = if n > quads { x(quads)[0] } else { 1.0 };
                let t = kernels::AdamWStep::new(hyper, step.step_number(), scale);
                for k in (0..quads).step_by(4) {
                    let store = kernels::Store::new(hyper.rounding, step.dropout_stream());
                    let (p, g) = (step.input_mut(k), x(k + 1));
                    let (m, v) = (step.input_mut(k + 2), step.input_mut(k + 3));
                    kernels::adamw_update(p, g, m, v, &t, store);
                }
            }
            Op::Sgd(p) => kernels::sgd_update(
                step.input_mut(0),
                x(1),
                step.input_mut(2),
                p,
                (step.step_number(), if n > 3 { x(3)[0] } else { 1.0 }),
                kernels::Store::new(p.rounding, step.dropout_stream()),
            ),
            op => return Err(foreign_op(op, "optimizer")),
        }
        Ok(())
    }

    fn cpu_workspace_bytes(&self, _: &Op, _: &[&TensorType], _: &TensorType) -> u64 {
        0
    }
}
