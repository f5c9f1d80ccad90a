//! CPU reference kernel of the matmul op (batched, broadcasting, optional transposes).

mod kernels;

use crate::exec::cpu::CpuStep;
use crate::exec::ExecError;
use crate::ir::{Op, TensorType};
use crate::ops::cpu::{foreign_op, CpuKernel};

impl CpuKernel for super::Family {
    fn run_cpu(&self, step: &CpuStep) -> Result<(), ExecError> {
        match step.op() {
            Op::MatMul { ta, tb, bias, .. } => {
                let out = step.output();
                kernels::matmul(
                    step.input(0),
                    step.shape(0),
                    *ta,
                    step.input(1),
                    step.shape(1),
                    *tb,
                    out,
                    step.out_shape(),
                );
                if *bias {
                    kernels::add_rows(out, step.input(2));
                }
                Ok(())
            }
            Op::MatMulBiasGrad { ta, tb, .. } => {
                let (a, b) = (step.shape(0), step.shape(1));
                let m = if *ta { a[1] } else { a[0] };
                let (k, n) = if *tb { (b[1], b[0]) } else { (b[0], b[1]) };
                // The sums are the flat output's last `n` elements (`ops::matmul::bias_grad_offset`).
                let (product, rest) = step.output().split_at_mut(m * n);
                kernels::matmul(
                    step.input(0),
                    a,
                    *ta,
                    step.input(1),
                    b,
                    *tb,
                    product,
                    &[m, n],
                );
                let (gap, sums) = rest.split_at_mut(rest.len() - n);
                gap.fill(0.0);
                // `op(b)`'s column sums: `b`'s own, or its row sums when stored transposed,
                // as the `sum_to` they replace sums them.
                let (stored, summed): (&[usize], &[usize]) = match tb {
                    true => (&[n, k], &[n, 1]),
                    false => (&[k, n], &[n]),
                };
                crate::exec::kernels::reduce::sum_to(step.input(1), stored, sums, summed);
                Ok(())
            }
            op => Err(foreign_op(op, "matmul")),
        }
    }

    fn cpu_workspace_bytes(&self, _: &Op, _: &[&TensorType], _: &TensorType) -> u64 {
        0
    }
}
