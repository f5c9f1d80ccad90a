//! The time of one kernel launch on a GPU, from a roofline: the slower of its FLOPs at the
//! rate its kind of kernel achieves and its bytes at the bandwidth a kernel achieves, plus a
//! fixed launch overhead. The achievable fractions are stated assumptions, not measurements.

use super::GpuSpec;
use crate::ir::{DType, Op, TensorType};
use crate::ops::rules::Compute;
use serde::{Deserialize, Serialize};

/// Fraction of the dense tensor-core peak a tensor-core kernel reaches. cuBLASLt bf16 GEMMs
/// at transformer shapes reach about 70-80% of an H100's dense peak and FlashAttention-2
/// 50-70% forward (see `REFERENCES.md`); 0.7 sits between the two.
pub const TENSOR_CORE_EFFICIENCY: f64 = 0.7;

/// Fraction of the dense tensor-core peak memc's own `mma.sync` kernels reach (attention's
/// forward and backward): half of [`TENSOR_CORE_EFFICIENCY`], as they load their operands from shared
/// memory one pair at a time (no `ldmatrix`, no `cp.async` pipelining), and the forward
/// issues its `P V` product twice (P split into two 16-bit parts). A stated assumption until
/// measured.
pub const MMA_KERNEL_EFFICIENCY: f64 = 0.35;

/// Fraction of the fp32 FMA peak a SIMT kernel reaches. The generated GEMM (64 x 64 tiles,
/// 4 x 4 outputs per thread, scalar shared-memory loads) issues two shared loads per four
/// FMAs, which caps it near half the FMA rate before global-load stalls; a review of it at
/// GPT-2 size put it at about 2% of an H100's bf16 peak, which is 30% of its fp32 peak.
pub const SIMT_EFFICIENCY: f64 = 0.3;

/// Fraction of the fp32 FMA peak cuBLAS's fp32 GEMMs reach at transformer shapes (the usual
/// figure for large SGEMMs; no TF32).
pub const LIBRARY_FP32_EFFICIENCY: f64 = 0.8;

/// Fraction of the memory bandwidth a kernel streaming its operands reaches. Bandwidth
/// tests (e.g. BabelStream) reach 80-90% of HBM peak with vector loads; memc's kernels load
/// one element per thread and instruction, so the lower 0.7.
pub const MEMORY_EFFICIENCY: f64 = 0.7;

/// Seconds each kernel launch adds: the host-side cost of one `cuLaunchKernel` without CUDA
/// Graphs plus the device's launch latency, about 5 microseconds on recent drivers. The plan
/// launches its steps one by one, so every launch pays it.
pub const LAUNCH_OVERHEAD_S: f64 = 5e-6;

/// What one launch does, as the cost model sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Work {
    /// FLOPs of the launch (multiply-add = 2).
    pub flops: u64,
    /// Bytes the launch moves: every input read once, the output written, the inputs it
    /// updates in place written back, and its workspace.
    pub bytes: u64,
    /// What the kernel computes on (the op family's answer).
    pub compute: Compute,
    /// The dtype it computes on: its first input's (its output's without inputs).
    pub dtype: DType,
}

impl Work {
    /// The work of one launch of `op` reading `inputs` (each counted once as listed) and
    /// writing `output` (None for updates, which write their mutated inputs instead), with
    /// `workspace` bytes of scratch and `flops` as the op's rule counts them.
    pub fn new(
        op: &Op,
        flops: u64,
        inputs: &[&TensorType],
        output: Option<&TensorType>,
        workspace: u64,
    ) -> Work {
        let read: u64 = inputs.iter().map(|t| t.bytes()).sum();
        let written_back: u64 = op
            .mutated_inputs()
            .iter()
            .filter_map(|&i| inputs.get(i))
            .map(|t| t.bytes())
            .sum();
        let behaviour = crate::ops::family(op).behaviour(op);
        Work {
            flops,
            bytes: read + written_back + output.map_or(0, TensorType::bytes) + workspace,
            compute: behaviour.compute,
            dtype: inputs
                .first()
                .or(output.as_ref())
                .map_or(DType::F32, |t| t.dtype),
        }
    }

    /// Whether the launch runs on tensor cores: a library GEMM or an MMA kernel over 16-bit
    /// operands.
    pub fn on_tensor_cores(&self) -> bool {
        self.compute != Compute::Simt && matches!(self.dtype, DType::BF16 | DType::F16)
    }

    /// The FLOP/s this work achieves on `gpu`: library GEMMs at the 16-bit tensor-core rate
    /// times [`TENSOR_CORE_EFFICIENCY`] in 16 bits, at the fp32 FMA rate times
    /// [`LIBRARY_FP32_EFFICIENCY`] in fp32; generated MMA kernels at the tensor-core rate
    /// times [`MMA_KERNEL_EFFICIENCY`] in 16 bits and at their fp32 form's rate otherwise
    /// (library or SIMT); other generated kernels at the fp32 FMA rate times
    /// [`SIMT_EFFICIENCY`].
    pub fn achievable_flops(&self, gpu: &GpuSpec) -> f64 {
        match (self.compute, self.on_tensor_cores()) {
            (Compute::Library, true) => gpu.tensor_16bit * TENSOR_CORE_EFFICIENCY,
            (Compute::Library | Compute::MmaOrLibrary, false) => gpu.fp32 * LIBRARY_FP32_EFFICIENCY,
            (Compute::Mma | Compute::MmaOrLibrary, true) => {
                gpu.tensor_16bit * MMA_KERNEL_EFFICIENCY
            }
            _ => gpu.fp32 * SIMT_EFFICIENCY,
        }
    }

    /// The estimated time of one launch on `gpu`.
    pub fn time(&self, gpu: &GpuSpec) -> Time {
        let compute = self.flops as f64 / self.achievable_flops(gpu);
        let memory = self.bytes as f64 / (gpu.bandwidth * MEMORY_EFFICIENCY);
        Time {
            compute,
            memory,
            bound: if compute > memory {
                Bound::Compute
            } else {
                Bound::Memory
            },
        }
    }
}

/// Which limit a launch's time comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    /// Its FLOPs take longer than its bytes.
    Compute,
    /// Its bytes take at least as long as its FLOPs.
    Memory,
}

/// The estimated time of one launch, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Time {
    /// FLOPs at the achievable rate.
    pub compute: f64,
    /// Bytes at the achievable bandwidth.
    pub memory: f64,
    /// The larger of the two.
    pub bound: Bound,
}

impl Time {
    /// The bound part, `max(compute, memory)`, without the launch overhead.
    pub fn bound_seconds(&self) -> f64 {
        self.compute.max(self.memory)
    }

    /// The launch's whole time: the bound part plus [`LAUNCH_OVERHEAD_S`].
    pub fn seconds(&self) -> f64 {
        self.bound_seconds() + LAUNCH_OVERHEAD_S
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::Gpu;
    use crate::ir::{cost::flops, BinaryFn};

    fn t(dtype: DType, shape: &[usize]) -> TensorType {
        TensorType::new(dtype, shape.to_vec())
    }

    #[test]
    fn a_large_matmul_is_compute_bound_on_tensor_cores() {
        let op = Op::matmul(false, false);
        let (a, b, c) = (
            t(DType::BF16, &[4096, 4096]),
            t(DType::BF16, &[4096, 4096]),
            t(DType::BF16, &[4096, 4096]),
        );
        let f = flops(&op, &[&a, &b], &c);
        assert_eq!(f, 2 * 4096 * 4096 * 4096);
        let w = Work::new(&op, f, &[&a, &b], Some(&c), 0);
        assert_eq!(w.bytes, 3 * 4096 * 4096 * 2);
        assert_eq!(w.compute, Compute::Library, "matmuls are cuBLASLt GEMMs");
        let h100 = Gpu::H100.spec();
        let time = w.time(h100);
        assert_eq!(time.bound, Bound::Compute);
        assert_eq!(time.compute, f as f64 / (989.4e12 * 0.7));
        assert_eq!(time.seconds(), time.compute + 5e-6);
        // 137.4 GFLOP at 692.6 TFLOP/s.
        assert!((time.compute - 1.9844e-4).abs() < 1e-7, "{}", time.compute);
    }

    #[test]
    fn library_and_mma_16_bit_work_run_on_tensor_cores_and_fp32_at_fma_rates() {
        let mut w = Work {
            flops: 1_000_000_000_000,
            bytes: 0,
            compute: Compute::Library,
            dtype: DType::BF16,
        };
        let a100 = Gpu::A100.spec();
        assert_eq!(w.time(a100).compute, 1e12 / (312e12 * 0.7));
        w.dtype = DType::F32;
        assert_eq!(w.time(a100).compute, 1e12 / (19.5e12 * 0.8));
        w.compute = Compute::Mma;
        assert_eq!(w.time(a100).compute, 1e12 / (19.5e12 * 0.3));
        w.dtype = DType::F16;
        assert_eq!(w.time(a100).compute, 1e12 / (312e12 * 0.35));
        w.compute = Compute::Simt;
        assert_eq!(w.time(a100).compute, 1e12 / (19.5e12 * 0.3));
    }

    #[test]
    fn an_add_is_memory_bound_at_the_achievable_bandwidth() {
        let op = Op::Binary(BinaryFn::Add);
        let x = t(DType::F32, &[1 << 20]);
        let f = flops(&op, &[&x, &x], &x);
        let w = Work::new(&op, f, &[&x, &x], Some(&x), 0);
        assert_eq!(w.bytes, 12 << 20);
        let time = w.time(Gpu::H100.spec());
        assert_eq!(time.bound, Bound::Memory);
        assert_eq!(time.memory, (12u64 << 20) as f64 / (3.35e12 * 0.7));
        // 12 MiB at 2.345 TB/s: 5.37 us, plus 5 us to launch.
        assert!(
            (time.seconds() - 10.365e-6).abs() < 1e-8,
            "{}",
            time.seconds()
        );
    }

    #[test]
    fn an_update_writes_back_the_inputs_it_mutates_and_its_workspace_counts() {
        let op = Op::Sgd(crate::ir::SgdParams {
            lr: 0.1,
            momentum: 0.9,
            weight_decay: 0.0,
            rounding: crate::ops::optimizer::Rounding::Nearest,
        });
        let p = t(DType::F32, &[256]);
        let w = Work::new(&op, 0, &[&p, &p, &p], None, 64);
        let mutated = op.mutated_inputs().len() as u64;
        assert_eq!(w.bytes, (3 + mutated) * 1024 + 64);
        assert_eq!(w.time(Gpu::H100.spec()).bound, Bound::Memory);
    }
}
