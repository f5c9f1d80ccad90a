//! CPU kernels of the copies between tiers: the executor keeps the two tiers as separate
//! allocations, so each copy moves the values from one into the other. Values arrive decoded
//! to f32 and are encoded again on store, which gives back the same bits for every dtype.

use crate::exec::cpu::CpuStep;
use crate::exec::ExecError;
use crate::ir::{Op, TensorType};
use crate::ops::cpu::{foreign_op, CpuKernel};

impl CpuKernel for super::Family {
    fn run_cpu(&self, step: &CpuStep) -> Result<(), ExecError> {
        match step.op() {
            Op::CopyToHost | Op::CopyFromHost => step.output().copy_from_slice(step.input(0)),
            Op::CopyToDevice => step.input_mut(0).copy_from_slice(step.input(1)),
            op => return Err(foreign_op(op, "transfer")),
        }
        Ok(())
    }

    fn cpu_workspace_bytes(&self, _: &Op, _: &[&TensorType], _: &TensorType) -> u64 {
        0
    }
}
