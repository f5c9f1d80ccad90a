//! CPU reference kernels of the norm ops (layer, RMS, batch and group normalization and
//! their input, weight and bias backwards, and batch norm's running statistics).

mod kernels;

use crate::exec::cpu::CpuStep;
use crate::exec::lowp::{self, round};
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
            Op::AddNorm { kind, eps, store } => {
                let (n, out) = (x(0).len(), step.output());
                out.fill(0.0);
                let (sum, rest) = out.split_at_mut(n);
                for (o, (a, b)) in sum.iter_mut().zip(x(0).iter().zip(x(1))) {
                    *o = a + b;
                }
                let bias = (step.input_count() > 3).then(|| x(3));
                let mut y = vec![0.0; n];
                kernels::norm_forward(*kind, *eps, sum, s, x(2), bias, &mut y);
                let t = store.unwrap_or(crate::ir::DType::F32);
                let normed = &mut rest[super::add_norm_at(n as u64, t.size()).0 as usize - n..];
                lowp::pack(t, &y, normed);
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
            Op::NormBackward {
                kind,
                eps,
                bias,
                sum,
                copy,
            } => {
                let (rows, ch) = (x(0).len() / x(1).len().max(1), x(1).len());
                let dims = (rows as u64, ch as u64, step.dtype(0).size());
                let copy_bytes = copy.map(|t| t.size());
                let at = super::GradsLayout::new(dims, *bias, sum.is_some(), copy_bytes);
                let out = step.output();
                out.fill(0.0);
                let (dx, grads) = out.split_at_mut(rows * ch);
                let region = |at: u64| at as usize - rows * ch;
                kernels::norm_backward_input(*kind, *eps, x(0), s, x(1), x(2), dx);
                if step.input_count() > 3 {
                    kernels::accumulate(dx, x(3));
                }
                let (w, b) = (region(at.weight), region(at.bias));
                kernels::norm_backward_weight(*kind, *eps, x(0), s, x(2), &mut grads[w..w + ch]);
                if *bias {
                    kernels::norm_backward_bias(*kind, x(2), s, &mut grads[b..b + ch]);
                }
                if let Some(t) = sum {
                    let rounded: Vec<f32> = dx.iter().map(|&v| round(*t, v)).collect();
                    let d = region(at.sum);
                    kernels::norm_backward_bias(*kind, &rounded, s, &mut grads[d..d + ch]);
                }
                if let Some(t) = copy {
                    lowp::pack(*t, dx, &mut grads[region(at.copy)..]);
                }
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
