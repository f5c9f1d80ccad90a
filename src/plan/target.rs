//! The backend a plan is built for: what scratch each step needs there and how buffers align.

use crate::ir::{Op, TensorType};
use serde::{Deserialize, Serialize};
use std::fmt;

/// A backend the plan builder lays steps out for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// The CPU reference executor.
    #[default]
    Cpu,
    /// A CUDA device of at least compute capability `sm` (major, minor).
    Cuda { sm: (u32, u32) },
}

impl Target {
    /// The CUDA target of the oldest devices the generated kernels run on (sm_80).
    pub const CUDA_MIN: Target = Target::Cuda { sm: (8, 0) };

    /// Scratch bytes one launch of `op` needs on this target (0 when it needs none).
    ///
    /// On the CPU this is the op family's [`crate::ops::cpu::CpuKernel::cpu_workspace_bytes`],
    /// on CUDA its [`crate::ops::cuda::CudaLowering::cuda_workspace_bytes`] (the kernels that
    /// take a workspace receive its offset as an argument).
    pub fn workspace_bytes(&self, op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
        let family = crate::ops::family(op);
        match self {
            Target::Cpu => family.cpu_workspace_bytes(op, inputs, out),
            Target::Cuda { .. } => family.cuda_workspace_bytes(op, inputs, out),
        }
    }

    /// The alignment in bytes of every buffer offset: 256 on both backends (the CUDA
    /// allocation granule, and the widest vector load any kernel issues).
    pub fn alignment(&self) -> u64 {
        256
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Cpu => f.write_str("cpu"),
            Target::Cuda { sm: (major, minor) } => write!(f, "cuda (sm_{major}{minor})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{ConvParams, DType};

    #[test]
    fn each_target_asks_the_op_family() {
        let conv = Op::Conv(ConvParams::uniform(2, 1, 1, 1));
        let x = TensorType::new(DType::F32, vec![2, 3, 8, 8]);
        let w = TensorType::new(DType::F32, vec![4, 3, 3, 3]);
        let y = TensorType::new(DType::F32, vec![2, 4, 8, 8]);
        let cpu = Target::Cpu.workspace_bytes(&conv, &[&x, &w], &y);
        assert_eq!(
            cpu,
            crate::ops::family(&conv).cpu_workspace_bytes(&conv, &[&x, &w], &y)
        );
        assert!(cpu > 0);
        assert_eq!(Target::CUDA_MIN.workspace_bytes(&conv, &[&x, &w], &y), 0);
        // The fused loss head's weight gradient: the bytes of 4 rows of 100 bf16 logits on
        // the CPU, as 2 rows of fp32 logits.
        let lce = crate::ir::LinearCe {
            chunk: 4,
            transposed: false,
            ce: crate::ir::CeParams::default(),
        };
        let dw = Op::LinearCrossEntropyBackward {
            lce,
            which: crate::ir::LceGrad::Weight,
        };
        let h = TensorType::new(DType::BF16, vec![10, 8]);
        let wt = TensorType::new(DType::BF16, vec![8, 100]);
        let (t, rows) = (
            TensorType::new(DType::I32, vec![10]),
            TensorType::new(DType::F32, vec![10]),
        );
        let inputs = [&h, &wt, &t, &rows, &rows];
        assert_eq!(Target::Cpu.workspace_bytes(&dw, &inputs, &wt), 2 * 100 * 4);
        // CUDA: 4 rows of bf16 logits padded to 104 columns or a tile of 40 columns over the
        // 10 rows, rounded to 256 bytes, the rows' log-sum-exps, the logits' gradient
        // (written apart from them: 10 rows are fewer than an H100's SMs), then cuBLASLt's
        // scratch.
        let logits: u64 = 4 * 104;
        let regions = 2 * (logits * 2).div_ceil(256) * 256 + 256;
        assert_eq!(
            Target::CUDA_MIN.workspace_bytes(&dw, &inputs, &wt),
            regions + crate::ops::matmul::GEMM_WORKSPACE
        );
        assert_eq!(Target::Cpu.alignment(), Target::CUDA_MIN.alignment());
    }
}
