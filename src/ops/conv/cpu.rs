//! CPU reference kernels of the conv ops (N-d convolution, its input and weight backwards and
//! the transposed convolution), which stage im2col tiles in a workspace buffer.

mod kernels;

use super::Geom;
use crate::exec::cpu::CpuStep;
use crate::exec::ExecError;
use crate::ir::{Op, TensorType};
use crate::ops::cpu::{foreign_op, CpuKernel};

/// The forward geometry of a conv op from its operand and output shapes: `x`, `w` as the
/// convolution (not its adjoint) reads them.
fn geom(op: &Op, inputs: [&[usize]; 2], out: &[usize]) -> Option<Geom> {
    Some(match op {
        Op::Conv(c) => Geom::new(c, inputs[0], inputs[1]),
        Op::ConvBackwardInput { conv, .. } | Op::ConvTranspose { conv, .. } => {
            Geom::new(conv, out, inputs[1])
        }
        Op::ConvBackwardWeight { conv, .. } => Geom::new(conv, inputs[0], out),
        _ => return None,
    })
}

impl CpuKernel for super::Family {
    fn run_cpu(&self, step: &CpuStep) -> Result<(), ExecError> {
        let op = step.op();
        let Some(g) = geom(op, [step.shape(0), step.shape(1)], step.out_shape()) else {
            return Err(foreign_op(op, "conv"));
        };
        let (x, out, ws) = (|i| step.input(i), step.output(), step.workspace());
        match op {
            Op::Conv(_) => kernels::forward(&g, x(0), x(1), out, ws),
            Op::ConvBackwardInput { .. } | Op::ConvTranspose { .. } => {
                kernels::backward_input(&g, x(0), x(1), out, ws)
            }
            _ => kernels::backward_weight(&g, x(0), x(1), out, ws),
        }
        Ok(())
    }

    fn cpu_workspace_bytes(&self, op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
        match inputs {
            [a, b] => geom(op, [&a.shape, &b.shape], &out.shape)
                .map_or(0, |g| kernels::workspace_len(&g) as u64 * 4),
            _ => 0,
        }
    }
}
