//! The GPU cost model: each plan step's FLOPs, bytes moved and bound on a named GPU, summed
//! to an estimated step time (`memc compile --gpu h100`). Checkpointing and `memc advise`
//! rank their choices by this time. Figures are datasheet peaks (`gpu.rs`) times stated
//! efficiencies (`model.rs`): an estimate, never a measurement. An offloaded plan's copies
//! cross the GPU's host link (`gpu.rs`: PCIe 4/5, NVLink-C2C) and its updates run on the
//! host's CPU at a stated bandwidth (`offload.rs`).

mod estimate;
mod gpu;
mod model;
mod offload;

pub use estimate::{estimate, ms, render_text, Estimate, OpTime, StepTime};
pub use gpu::{Gpu, GpuSpec, HostLink, CONTEXT_RESERVE, NCCL_RESERVE, NVLINK_C2C, PCIE4, PCIE5};
pub use model::{
    Bound, Time, Work, LAUNCH_OVERHEAD_S, LIBRARY_FP32_EFFICIENCY, MEMORY_EFFICIENCY,
    MMA_KERNEL_EFFICIENCY, SIMT_EFFICIENCY, TENSOR_CORE_EFFICIENCY,
};
pub use offload::{offload_time, stream_time, OffloadTime, HOST_UPDATE_BANDWIDTH};
