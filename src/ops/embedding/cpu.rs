//! CPU reference kernels of the embedding ops (row gather by id and its scatter-add
//! backward).

mod kernels;

use crate::exec::cpu::CpuStep;
use crate::exec::ExecError;
use crate::ir::{Op, TensorType};
use crate::ops::cpu::{foreign_op, CpuKernel};

impl CpuKernel for super::Family {
    fn run_cpu(&self, step: &CpuStep) -> Result<(), ExecError> {
        match step.op() {
            Op::Embedding { .. } => {
                kernels::embedding(step.input(0), step.shape(0)[1], step.ids(1), step.output())
            }
            &Op::EmbeddingBackward { padding_idx, .. } => {
                let d = step.out_shape().get(1).copied().unwrap_or(1);
                let dy = step.input(1);
                kernels::embedding_backward(step.ids(0), dy, d, padding_idx, step.output())
            }
            op => Err(foreign_op(op, "embedding")),
        }
    }

    fn cpu_workspace_bytes(&self, _: &Op, _: &[&TensorType], _: &TensorType) -> u64 {
        0
    }
}
