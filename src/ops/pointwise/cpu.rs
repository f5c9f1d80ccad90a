//! CPU reference kernels of the pointwise ops (unary functions and their backward,
//! broadcasting binary ops, `where`, `clamp`, affine maps).

mod kernels;
mod select;

use crate::exec::cpu::CpuStep;
use crate::exec::ExecError;
use crate::ir::{Op, TensorType};
use crate::ops::cpu::{foreign_op, CpuKernel};

impl CpuKernel for super::Family {
    fn run_cpu(&self, step: &CpuStep) -> Result<(), ExecError> {
        let x = |i| step.input(i);
        match step.op() {
            Op::Unary(f) => kernels::unary_forward(*f, x(0), step.output()),
            Op::UnaryBackward(f) => kernels::unary_backward(*f, x(0), x(1), step.output()),
            Op::UnaryPair(f) => {
                let n = x(0).len();
                let (at, _) = crate::ops::packed_pair(n as u64, n as u64, step.dtype(0).size());
                let (y, rest) = step.output().split_at_mut(n);
                let (gap, dx) = rest.split_at_mut(at as usize - n);
                gap.fill(0.0);
                kernels::unary_forward(*f, x(0), y);
                kernels::unary_backward(*f, x(0), x(1), &mut dx[..n]);
            }
            Op::UnaryOutputBackward(f) => {
                kernels::unary_output_backward(*f, x(0), x(1), step.output())
            }
            Op::Binary(f) => kernels::binary(
                *f,
                x(0),
                step.shape(0),
                x(1),
                step.shape(1),
                step.output(),
                step.out_shape(),
            ),
            Op::Where => select::select(
                (x(0), step.shape(0)),
                (x(1), step.shape(1)),
                (x(2), step.shape(2)),
                step.output(),
                step.out_shape(),
            ),
            Op::Clamp(bounds) => select::clamp(*bounds, x(0), step.output()),
            Op::ClampBackward(bounds) => select::clamp_backward(*bounds, x(0), x(1), step.output()),
            Op::Affine { scale, shift } => kernels::affine(x(0), *scale, *shift, step.output()),
            op => return Err(foreign_op(op, "pointwise")),
        }
        Ok(())
    }

    fn cpu_workspace_bytes(&self, _: &Op, _: &[&TensorType], _: &TensorType) -> u64 {
        0
    }
}
