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
            op => Err(foreign_op(op, "matmul")),
        }
    }

    fn cpu_workspace_bytes(&self, _: &Op, _: &[&TensorType], _: &TensorType) -> u64 {
        0
    }
}
