//! CPU reference kernels of the cast ops.

use crate::exec::cpu::{CpuExecutor, Views};
use crate::exec::ExecError;
use crate::ir::{Op, TensorType};
use crate::ops::cpu::CpuKernel;
use crate::plan::Step;

impl CpuKernel for super::Family {
    fn run_cpu(&self, exec: &CpuExecutor, step: &Step, views: &Views) -> Result<(), ExecError> {
        exec.execute_legacy(step, views)
    }

    fn cpu_workspace_bytes(&self, op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
        crate::exec::kernels::workspace_bytes_legacy(op, inputs, out)
    }
}
