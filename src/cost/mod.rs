//! The GPU cost model: each plan step's FLOPs, bytes moved and bound on a named GPU, summed
//! to an estimated step time (`memc compile --gpu h100`). Checkpointing and `memc advise`
//! rank their choices by this time. Figures are datasheet peaks (`gpu.rs`) times stated
//! efficiencies (`model.rs`): an estimate, never a measurement.

mod estimate;
mod gpu;
mod model;

pub use estimate::{estimate, ms, render_text, Estimate, OpTime, StepTime};
pub use gpu::{Gpu, GpuSpec, CONTEXT_RESERVE};
pub use model::{
    Bound, Time, Work, LAUNCH_OVERHEAD_S, LIBRARY_FP32_EFFICIENCY, MEMORY_EFFICIENCY,
    SIMT_EFFICIENCY, TENSOR_CORE_EFFICIENCY,
};
