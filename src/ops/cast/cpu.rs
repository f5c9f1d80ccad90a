//! CPU reference kernels of the cast op and the cast group: copies, since every kernel
//! computes in f32 and the executor rounds the output once when it stores a 16-bit tensor.

use crate::exec::cpu::CpuStep;
use crate::exec::ExecError;
use crate::ir::{Op, TensorType};
use crate::ops::cpu::{foreign_op, CpuKernel};

impl CpuKernel for super::Family {
    fn run_cpu(&self, step: &CpuStep) -> Result<(), ExecError> {
        match step.op() {
            Op::Cast { .. } => {
                step.output().copy_from_slice(step.input(0));
                Ok(())
            }
            Op::CastGroup { .. } => {
                let mut out = step.output();
                for i in 0..step.input_count() {
                    let x = step.input(i);
                    let (part, rest) = out.split_at_mut(x.len());
                    part.copy_from_slice(x);
                    out = rest;
                }
                Ok(())
            }
            op => Err(foreign_op(op, "cast")),
        }
    }

    fn cpu_workspace_bytes(&self, _: &Op, _: &[&TensorType], _: &TensorType) -> u64 {
        0
    }
}
