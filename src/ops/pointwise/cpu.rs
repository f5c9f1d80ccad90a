//! CPU reference kernels of the pointwise ops (unary functions and their backward,
//! broadcasting binary ops, `where`, `clamp`, affine maps).

mod kernels;
mod select;

use crate::exec::cpu::CpuStep;
use crate::exec::ExecError;
use crate::ir::{Op, TensorType};
use crate::ops::cpu::{foreign_op, packed_pair_mut, CpuKernel};

impl CpuKernel for super::Family {
    fn run_cpu(&self, step: &CpuStep) -> Result<(), ExecError> {
        let x = |i| step.input(i);
        match step.op() {
            Op::Unary(f) => kernels::unary_forward(*f, x(0), step.output()),
            Op::UnaryBackward(f) => kernels::unary_backward(*f, x(0), x(1), step.output()),
            Op::UnaryPair(f) => {
                let n = x(0).len();
                let (y, dx) = packed_pair_mut(step.output(), (n, n), step.dtype(0).size());
                kernels::unary_forward(*f, x(0), y);
                kernels::unary_backward(*f, x(0), x(1), dx);
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
