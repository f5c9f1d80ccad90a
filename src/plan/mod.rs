//! The Plan: every step of one training or inference step in order, every buffer at a fixed
//! offset in one arena, and the report of what it needs. JSON (serde) is its stable form.

mod build;
mod classes;
pub mod copy_order;
mod host;
mod inputs;
mod live;
mod memory_summary;
mod origin;
mod parallel;
mod peak;
mod pipeline;
mod report;
mod summary;
mod target;
mod tier;
mod unified;
mod verify;
mod views;

pub use crate::settings::TrainSummary;
pub use build::{build, build_for, BuildOptions};
pub use classes::gradients as param_gradients;
pub use host::{HostBytes, Transfers};
pub use live::{
    live_peak, live_peak_with_workspace, live_profile, live_profile_with_workspace, LiveProfile,
};
pub use memory_summary::render_memory_summary;
pub use origin::{attach_lines, Role};
pub use parallel::{
    pipeline_report, report as parallel_report, ParallelReport, RankBytes, RankEntry,
};
pub use peak::{largest_at_peak, PeakTensor};
pub use pipeline::PipelineStage;
pub use report::{
    grouped, human_bytes, live_bytes, render_text, Bytes, CheckpointSummary, DeviceBytes,
    PhasePeak, PrecisionSummary, QuantSummary, RecomputedGroup, Report, SavedKind,
};
pub use target::Target;
pub use tier::{on_device, tier_of, Placement, Tier};
pub use unified::{
    report as unified_report, step_pages, FaultTime, FaultingStep, Unified, FAULT_LATENCY_S,
    PAGE_BYTES,
};
pub use verify::{verify, PlanError, VerifiedPlan};

use crate::ir::{Init, Op, Phase, TensorType};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Index of a buffer in [`Plan::buffers`]; `Display` is `b12`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BufferId(pub u32);

impl BufferId {
    /// Position in the plan's buffer list.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// How many times a step of `phase` runs in one training step of `micro_steps`
/// micro-batches: forward and backward once per micro-batch, the update once.
pub fn runs_per_step(phase: Phase, micro_steps: u32) -> u32 {
    match phase {
        Phase::Update => 1,
        Phase::Forward | Phase::Backward => micro_steps.max(1),
    }
}

impl Plan {
    /// The shape of the values parameter `p` holds: its weight's shape when it is stored
    /// quantized, else its buffer's.
    pub fn param_shape(&self, p: &ParamBinding) -> Vec<usize> {
        match &p.quant {
            Some(q) => q.shape.to_vec(),
            None => self.buffers[p.buffer.index()].ty.shape.clone(),
        }
    }

    /// Whether `step` launches a kernel: false for a step whose output is a view of its
    /// input's bytes (a reshape), which computes nothing.
    pub fn launches(&self, step: &Step) -> bool {
        step.output
            .and_then(|o| self.buffers.get(o.index()))
            .is_none_or(|b| b.view_of.is_none())
    }

    /// Live device bytes at each step (sum of the buffers whose lifetime contains it; views hold
    /// their root's bytes and count nothing; lifetimes are clamped to the steps, so a loaded
    /// plan cannot index past them).
    pub fn live_per_step(&self) -> Vec<u64> {
        self.live_per_step_of(|_| true)
    }

    /// Live bytes at each step of the device buffers `keep` selects (views never count:
    /// their bytes are their root's; host buffers are the host arena's, `report.host`).
    pub fn live_per_step_of(&self, keep: impl Fn(&Buffer) -> bool) -> Vec<u64> {
        let n = self.steps.len().max(1);
        live_bytes(
            n,
            self.buffers
                .iter()
                .filter(|b| b.view_of.is_none() && b.tier.is_device() && keep(b))
                .map(|b| {
                    let first = b.first.min(n - 1);
                    (b.bytes, first, b.last.min(n - 1).max(first))
                }),
        )
    }

    /// The parameters whose complete gradients `step` consumes and those gradients' buffers:
    /// an update on the device reads them (an AdamW group several), an offloaded update's
    /// copy to the host copies one.
    pub fn gradients_consumed(&self, step: &Step) -> Vec<(&str, BufferId)> {
        let param = |buffer: BufferId| self.params.iter().find(|p| p.buffer == buffer);
        let pairs = match step.op {
            Op::CopyToHost => (step.inputs.first())
                .and_then(|&g| Some((self.params.iter().find(|p| p.grad == Some(g))?, g)))
                .into_iter()
                .collect(),
            ref op => crate::ops::optimizer::stepped(op, &step.inputs)
                .into_iter()
                .filter_map(|(p, g, _)| Some((param(p)?, g)))
                .collect::<Vec<_>>(),
        };
        pairs
            .into_iter()
            .map(|(p, g)| (p.name.as_str(), g))
            .collect()
    }

    /// Micro-batches per training step: `accumulate` of the training spec (1 for inference).
    pub fn micro_steps(&self) -> u32 {
        self.train.as_ref().map_or(1, |t| t.accumulate.max(1))
    }

    /// How many times a step of `phase` runs in one training step ([`runs_per_step`]).
    pub fn runs(&self, phase: Phase) -> u32 {
        runs_per_step(phase, self.micro_steps())
    }

    /// The dropout stream of micro-step `micro` (0-based) of training step `step` (1-based)
    /// in a run seeded with `seed`: the 1-based count of micro-steps run so far (the step
    /// when nothing accumulates), mixed with the seed (seed 0 leaves the count as it is), so
    /// each run seed draws its own masks.
    pub fn dropout_stream(&self, seed: u64, step: u64, micro: u32) -> u64 {
        let count = (step.max(1) - 1) * u64::from(self.micro_steps()) + u64::from(micro) + 1;
        count ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl fmt::Display for BufferId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "b{}", self.0)
    }
}

/// What a buffer holds, which decides its lifetime class in the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BufferClass {
    /// Trainable parameter: persistent across steps.
    Param,
    /// Optimizer moments: persistent across steps.
    OptimState,
    /// Bound per step from outside.
    Input,
    /// A forward value (saved for backward when a backward step reads it).
    Activation,
    /// A parameter's complete gradient.
    Gradient,
    /// Any other backward or update temporary.
    Temporary,
    /// Kernel scratch live for one step.
    Workspace,
}

impl BufferClass {
    /// Every class, in the order the viz's legend and stacked view list them (persistent
    /// bytes first, then what a step allocates).
    pub const ALL: [BufferClass; 7] = [
        BufferClass::Param,
        BufferClass::OptimState,
        BufferClass::Input,
        BufferClass::Activation,
        BufferClass::Gradient,
        BufferClass::Temporary,
        BufferClass::Workspace,
    ];

    /// The class in a person's words, plural ("parameters", "optimizer state", ...), as the
    /// report, its summary and the viz name it.
    pub fn label(self) -> &'static str {
        match self {
            BufferClass::Param => "parameters",
            BufferClass::OptimState => "optimizer state",
            BufferClass::Input => "inputs",
            BufferClass::Activation => "activations",
            BufferClass::Gradient => "gradients",
            BufferClass::Temporary => "temporaries",
            BufferClass::Workspace => "workspace",
        }
    }

    /// Persistent buffers live across steps and are never reused within one.
    pub fn is_persistent(self) -> bool {
        matches!(self, BufferClass::Param | BufferClass::OptimState)
    }
}

/// One allocation inside the arena: live over steps `first..=last`, at `offset`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Buffer {
    pub id: BufferId,
    pub name: String,
    pub ty: TensorType,
    pub bytes: u64,
    pub offset: u64,
    pub first: usize,
    pub last: usize,
    pub class: BufferClass,
    /// The arena the buffer's offset is in: the device's, or the host's (`--offload`).
    #[serde(default, skip_serializing_if = "Tier::is_device")]
    pub tier: Tier,
    /// The buffer whose bytes this one views (a reshape's output shares its input's
    /// storage; a cast group's member is a range of the group's): at the root's offset plus
    /// [`Buffer::view_offset`], its bytes inside the root's, inside the root's lifetime;
    /// the step that outputs a view launches nothing ([`Plan::launches`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub view_of: Option<BufferId>,
    /// Where a view's bytes begin in its root's (0 for a reshape, and for a buffer that is
    /// no view).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub view_offset: u64,
    /// The `.mdl` expression that made the buffer's value (for backward and update values,
    /// the forward expression they belong to; a workspace, its step's), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub span: Option<crate::ir::Span>,
    /// The buffer's part in the step; a gradient's or optimizer state's names its
    /// parameter. Set by the plan builder for every buffer; None only in a plan saved before
    /// roles were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// The 1-based `.mdl` line `span` starts on, set by [`crate::compile`] (which has the
    /// source); its text is in [`Plan::source_lines`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
}

impl Buffer {
    /// The layout request of this buffer: its bytes over the half-open steps `first..last+1`;
    /// a view requests nothing of its own (its root holds the bytes).
    pub fn request(&self) -> crate::passes::arena::BufferRequest {
        crate::passes::arena::BufferRequest {
            size: if self.view_of.is_some() {
                0
            } else {
                self.bytes
            },
            start: self.first as u64,
            end: self.last as u64 + 1,
        }
    }
}

/// One kernel launch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub op: Op,
    pub inputs: Vec<BufferId>,
    /// None for updates, which write their inputs in place.
    pub output: Option<BufferId>,
    pub workspace: Option<BufferId>,
    pub flops: u64,
    pub phase: Phase,
    pub scope: String,
}

/// A parameter: its buffer, initializer, (when trained) its gradient buffer and (when a
/// frozen weight is stored quantized) its packing: its buffer then holds the packed bytes,
/// and executors quantize the values written to it and dequantize the values read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParamBinding {
    pub name: String,
    pub buffer: BufferId,
    pub init: Init,
    pub grad: Option<BufferId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quant: Option<crate::ir::Quantized>,
    /// Under ZeRO-3, the full shape of a parameter whose buffer holds this rank's flat
    /// shard of it ([`crate::ops::collective::shard_len`] elements).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_of: Option<Vec<usize>>,
    /// Under ZeRO-1 and 2 with mixed precision, this rank's fp32 master shard of a 16-bit
    /// parameter (optimizer state that starts from the rank's slice of the parameter's
    /// initial values; the parameter's buffer holds the whole 16-bit copy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master: Option<BufferId>,
    /// A batch norm running statistic: model state saved and loaded with the parameters,
    /// never trained (no gradient), not counted among the parameters.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub running_statistic: bool,
    /// Under tensor parallelism, how this rank's slice of the whole parameter is taken (the
    /// buffer holds the slice, of [`crate::parallel::TensorSplit::local_shape`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_split: Option<crate::parallel::TensorSplit>,
}

/// Persistent state that is not trained (optimizer moments, the loss scale) and the value
/// each of its elements holds before the first step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateBinding {
    pub buffer: BufferId,
    pub init: f32,
}

/// An input: its buffer, and for integer inputs the exclusive upper bound of valid ids, the
/// one id outside `0..id_limit` that every reader ignores (a cross-entropy's
/// `ignore_index`), which the input may also hold, and whether attention reads it only as a
/// key mask (its synthetic data is then all ones: no padding).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputBinding {
    pub name: String,
    pub buffer: BufferId,
    pub id_limit: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id_ignored: Option<i32>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub key_mask: bool,
}

/// A compiled step. Built by [`build`]; reaches a backend only through [`verify`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub model: String,
    pub buffers: Vec<Buffer>,
    pub steps: Vec<Step>,
    pub arena_bytes: u64,
    /// Bytes of the host arena, which holds the buffers of [`Tier::Host`] (0 without one).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub host_bytes: u64,
    pub alignment: u64,
    /// The backend the plan was built for (CPU when a saved plan does not say).
    #[serde(default)]
    pub target: Target,
    pub params: Vec<ParamBinding>,
    pub optim_state: Vec<StateBinding>,
    pub inputs: Vec<InputBinding>,
    pub outputs: Vec<(String, BufferId)>,
    pub train: Option<TrainSummary>,
    pub report: Report,
    /// The trimmed text of every `.mdl` line a buffer's [`Buffer::line`] names, by line
    /// number (empty when the plan was built without its source).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub source_lines: std::collections::BTreeMap<usize, String>,
    /// Where this plan sits in a pipeline (absent without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<PipelineStage>,
    /// The plans of pipeline stages 1 to P - 1, in stage order, when this plan is stage
    /// 0's; empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<Plan>,
}
