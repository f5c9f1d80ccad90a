//! CPU reference kernel of `Dequantize`: [`super::pack::unpack_into`] over the packed bytes;
//! the executor rounds the f32 weights once when it stores a 16-bit output.

use crate::exec::cpu::CpuStep;
use crate::exec::ExecError;
use crate::ir::{Op, TensorType};
use crate::ops::cpu::{foreign_op, CpuKernel};

impl CpuKernel for super::Family {
    fn run_cpu(&self, step: &CpuStep) -> Result<(), ExecError> {
        match step.op() {
            Op::Dequantize { quant, .. } => {
                super::pack::unpack_into(quant, &step.bytes(0), step.output());
                Ok(())
            }
            op => Err(foreign_op(op, "quant")),
        }
    }

    fn cpu_workspace_bytes(&self, _: &Op, _: &[&TensorType], _: &TensorType) -> u64 {
        0
    }
}
