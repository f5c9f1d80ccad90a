//! The GPUs the cost model knows, with their vendor datasheet figures.

use crate::diagnostic::UserError;
use serde::{Deserialize, Serialize};

/// A GPU the step time can be estimated on (`--gpu`). H100 is the default wherever a
/// ranking needs a GPU and none is named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Gpu {
    /// NVIDIA A100 SXM 80GB.
    A100,
    /// NVIDIA H100 SXM.
    #[default]
    H100,
    /// NVIDIA H200 SXM.
    H200,
    /// NVIDIA GH200 Grace Hopper Superchip (96 GB HBM3), its GPU linked to the Grace CPU's
    /// memory by NVLink-C2C.
    Gh200,
    /// NVIDIA GeForce RTX 4090.
    Rtx4090,
}

/// Peak figures of one GPU: dense (no structured sparsity) rates, at boost clock, as the
/// vendor publishes them. Rates are FLOP/s, bandwidth bytes/s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuSpec {
    /// The product name, e.g. `H100 SXM`.
    pub name: &'static str,
    /// Dense bf16/fp16 tensor-core FLOP/s with fp32 accumulation (memc's GEMMs accumulate
    /// in fp32).
    pub tensor_16bit: f64,
    /// Dense TF32 tensor-core FLOP/s.
    pub tensor_tf32: f64,
    /// fp32 FMA FLOP/s on the CUDA cores (no tensor cores).
    pub fp32: f64,
    /// Device memory bandwidth.
    pub bandwidth: f64,
    /// Streaming multiprocessors.
    pub sms: u32,
    /// Compute capability (major, minor): the architecture kernels are compiled for.
    pub compute: (u32, u32),
    /// Most threads resident on one SM (CUDA C++ Programming Guide, "Technical
    /// Specifications per Compute Capability": 2048 on 8.0 and 9.0, 1536 on 8.9). The
    /// driver reserves each kernel's local memory (stack frame) for this many threads on
    /// every SM.
    pub threads_per_sm: u32,
    /// Device memory in bytes: the datasheet's GB figure taken as GiB (the driver reports
    /// slightly less, e.g. 79.6 GiB on an H100 SXM).
    pub memory: u64,
    /// Device bytes the CUDA context and memc's loaded kernels take before the arena
    /// ([`CONTEXT_RESERVE`]); a plan for the GPU is budgeted with it on top of its arena.
    pub context_reserve: u64,
    /// The link between the GPU and host memory, which an offloaded plan's copies cross.
    pub host_link: HostLink,
}

/// The link between a GPU and host memory, with the bandwidth a large pinned copy reaches
/// in one direction: an assumption from the link's nominal rate, not a measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostLink {
    /// The link in words, e.g. `PCIe 5.0 x16`.
    pub name: &'static str,
    /// Bytes/s one direction of a large pinned-memory copy reaches.
    pub bandwidth: f64,
}

/// PCIe 4.0 x16: 32 GB/s nominal a direction, about 25 GB/s reached by pinned copies
/// (`cudaMemcpyAsync` bandwidth tests).
pub const PCIE4: HostLink = HostLink {
    name: "PCIe 4.0 x16",
    bandwidth: 25e9,
};

/// PCIe 5.0 x16: 64 GB/s nominal a direction, about 50 GB/s reached by pinned copies.
pub const PCIE5: HostLink = HostLink {
    name: "PCIe 5.0 x16",
    bandwidth: 50e9,
};

/// NVLink-C2C of the GH200: 900 GB/s both directions together (NVIDIA GH200 Grace Hopper
/// Superchip datasheet, 2023), 450 GB/s a direction, taken as reached.
pub const NVLINK_C2C: HostLink = HostLink {
    name: "NVLink-C2C",
    bandwidth: 450e9,
};

/// The CUDA context with memc's kernels loaded, as measured by `cuMemGetInfo` before the
/// arena's allocation on an H200 (driver 580.159, CUDA 13.0): 528.8 MiB, for GPT-2 small's
/// kernels and for the MLP's alike, rounded up to 529 MiB. Taken for every GPU until
/// measured on each (`--context-reserve` overrides it).
pub const CONTEXT_RESERVE: u64 = 529 << 20;

/// The device bytes NCCL takes on each rank of a data-parallel plan beside the CUDA context,
/// a stated figure (not measured by memc): its default buffers, `NCCL_BUFFSIZE` 4 MiB per
/// channel and direction for up to 32 channels (256 MiB), doubled for its FIFOs, proxy
/// buffers and the communicator's own allocations: 512 MiB. Budgets of parallel plans for a
/// GPU hold arena + CUDA context + this.
pub const NCCL_RESERVE: u64 = 512 << 20;

const TERA: f64 = 1e12;
const GIB: u64 = 1 << 30;

/// A100 SXM 80GB. NVIDIA A100 Tensor Core GPU datasheet (2021): FP32 19.5 TFLOPS, TF32
/// Tensor Core 156 TFLOPS and BF16/FP16 Tensor Core 312 TFLOPS dense (312 and 624 with
/// sparsity), HBM2e 2,039 GB/s, 80 GB. 108 SMs: NVIDIA A100 Tensor Core GPU Architecture
/// whitepaper (2020), table 3.
const A100: GpuSpec = GpuSpec {
    name: "A100 SXM 80GB",
    tensor_16bit: 312.0 * TERA,
    tensor_tf32: 156.0 * TERA,
    fp32: 19.5 * TERA,
    bandwidth: 2039e9,
    sms: 108,
    compute: (8, 0),
    threads_per_sm: 2048,
    memory: 80 * GIB,
    context_reserve: CONTEXT_RESERVE,
    host_link: PCIE4,
};

/// H100 SXM. NVIDIA H100 Tensor Core GPU datasheet (2023): FP32 67 TFLOPS; TF32 989 and
/// BF16/FP16 1,979 TFLOPS with sparsity, half that dense (494.7 and 989.4 in the NVIDIA H100
/// Tensor Core GPU Architecture whitepaper, table 2); HBM3 3.35 TB/s, 80 GB; 132 SMs
/// (whitepaper, table 3).
const H100: GpuSpec = GpuSpec {
    name: "H100 SXM",
    tensor_16bit: 989.4 * TERA,
    tensor_tf32: 494.7 * TERA,
    fp32: 66.9 * TERA,
    bandwidth: 3.35e12,
    sms: 132,
    compute: (9, 0),
    threads_per_sm: 2048,
    memory: 80 * GIB,
    context_reserve: CONTEXT_RESERVE,
    host_link: PCIE5,
};

/// H200 SXM. NVIDIA H200 Tensor Core GPU datasheet (2024): the H100's compute (FP32 67
/// TFLOPS; TF32 989 and BF16/FP16 1,979 TFLOPS with sparsity, half that dense) with HBM3e
/// at 4.8 TB/s, 141 GB. The same GH100 configuration as the H100 SXM: 132 SMs.
const H200: GpuSpec = GpuSpec {
    name: "H200 SXM",
    tensor_16bit: 989.4 * TERA,
    tensor_tf32: 494.7 * TERA,
    fp32: 66.9 * TERA,
    bandwidth: 4.8e12,
    sms: 132,
    compute: (9, 0),
    threads_per_sm: 2048,
    memory: 141 * GIB,
    context_reserve: CONTEXT_RESERVE,
    host_link: PCIE5,
};

/// GH200 Grace Hopper Superchip, 96 GB. NVIDIA GH200 Grace Hopper Superchip datasheet
/// (2023): the H100's compute (FP32 67 TFLOPS; TF32 989 and BF16/FP16 1,979 TFLOPS with
/// sparsity, half that dense), HBM3 at 4 TB/s, 96 GB; 132 SMs; NVLink-C2C to the Grace
/// CPU's LPDDR5X at 900 GB/s.
const GH200: GpuSpec = GpuSpec {
    name: "GH200 96GB",
    tensor_16bit: 989.4 * TERA,
    tensor_tf32: 494.7 * TERA,
    fp32: 66.9 * TERA,
    bandwidth: 4.0e12,
    sms: 132,
    compute: (9, 0),
    threads_per_sm: 2048,
    memory: 96 * GIB,
    context_reserve: CONTEXT_RESERVE,
    host_link: NVLINK_C2C,
};

/// GeForce RTX 4090. NVIDIA Ada Lovelace GPU Architecture whitepaper (2022), appendix A,
/// table 2: 128 SMs, FP32 82.6 TFLOPS, BF16/FP16 tensor with FP32 accumulate 165.2 TFLOPS
/// dense (330.4 with sparsity; GeForce accumulates fp32 at half the fp16-accumulate rate),
/// TF32 tensor 82.6 TFLOPS dense, GDDR6X 1,008 GB/s, 24 GB.
const RTX4090: GpuSpec = GpuSpec {
    name: "RTX 4090",
    tensor_16bit: 165.2 * TERA,
    tensor_tf32: 82.6 * TERA,
    fp32: 82.6 * TERA,
    bandwidth: 1008e9,
    sms: 128,
    compute: (8, 9),
    threads_per_sm: 1536,
    memory: 24 * GIB,
    context_reserve: CONTEXT_RESERVE,
    host_link: PCIE4,
};

impl Gpu {
    /// Every known GPU, in the order `--gpu`'s help lists them.
    pub const ALL: [Gpu; 5] = [Gpu::A100, Gpu::H100, Gpu::H200, Gpu::Gh200, Gpu::Rtx4090];

    /// The `--gpu` name: `a100`, `h100`, `h200`, `gh200` or `rtx4090`.
    pub fn name(self) -> &'static str {
        match self {
            Gpu::A100 => "a100",
            Gpu::H100 => "h100",
            Gpu::H200 => "h200",
            Gpu::Gh200 => "gh200",
            Gpu::Rtx4090 => "rtx4090",
        }
    }

    /// The GPU's datasheet figures.
    pub fn spec(self) -> &'static GpuSpec {
        match self {
            Gpu::A100 => &A100,
            Gpu::H100 => &H100,
            Gpu::H200 => &H200,
            Gpu::Gh200 => &GH200,
            Gpu::Rtx4090 => &RTX4090,
        }
    }

    /// The GPU named `text` (case-insensitive). An unknown name is an error whose help
    /// lists the known ones.
    pub fn parse(text: &str) -> Result<Gpu, UserError> {
        let wanted = text.trim().to_ascii_lowercase();
        Gpu::ALL
            .into_iter()
            .find(|g| g.name() == wanted)
            .ok_or_else(|| {
                let names: Vec<&str> = Gpu::ALL.iter().map(|g| g.name()).collect();
                UserError::general(
                    format!("unknown GPU `{text}`"),
                    format!("use one of: {}", names.join(", ")),
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_parses_back_to_its_gpu_in_any_case() {
        for g in Gpu::ALL {
            assert_eq!(Gpu::parse(g.name()).ok(), Some(g));
            assert_eq!(Gpu::parse(&g.name().to_uppercase()).ok(), Some(g));
        }
    }

    #[test]
    fn an_unknown_name_lists_the_known_ones() {
        let e = Gpu::parse("v100").err();
        let e = e
            .as_ref()
            .map(|e| (e.message.as_str(), e.help.as_str(), e.span));
        assert_eq!(
            e,
            Some((
                "unknown GPU `v100`",
                "use one of: a100, h100, h200, gh200, rtx4090",
                None
            ))
        );
    }

    #[test]
    fn dense_tensor_rates_are_twice_tf32_on_data_center_parts() {
        for g in [Gpu::A100, Gpu::H100, Gpu::H200, Gpu::Gh200] {
            let s = g.spec();
            assert_eq!(s.tensor_16bit, 2.0 * s.tensor_tf32, "{}", s.name);
            assert!(s.tensor_16bit > s.fp32);
        }
        assert_eq!(Gpu::H100.spec().sms, 132);
        assert_eq!(Gpu::Rtx4090.spec().memory, 24 << 30);
    }
}
