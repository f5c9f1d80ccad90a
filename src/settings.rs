//! How a step trains: the optimizer, the precision, accumulation, the budget and clipping.
//! The front end parses them from `train { }`, the passes apply them and the plan records
//! them, so they belong to none of those stages.

use crate::ir::{AdamWParams, SgdParams};
use serde::{Deserialize, Serialize};

/// The optimizer of a training step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Optimizer {
    AdamW(AdamWParams),
    Sgd(SgdParams),
}

/// Numeric precision of the step: fp32, or mixed with fp32 master weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    Fp32,
    Bf16,
    Fp16,
}

/// What a training plan records of its `train { }` settings: everything the executors and
/// the report read, without the source positions the front end keeps for diagnostics. The
/// JSON field names are those of the `train { }` settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainSummary {
    pub optimizer: Optimizer,
    pub precision: Precision,
    /// Whether bf16/fp16 steps keep fp32 master weights (parameters stored in the low
    /// precision when not).
    #[serde(default = "yes")]
    pub master_weights: bool,
    /// Micro-batches per step: the step runs the model as written this many times on
    /// successive micro-batches, accumulating gradients, then updates once.
    #[serde(default = "one")]
    pub accumulate: u32,
    /// Bytes the step must fit in, if set.
    pub budget: Option<u64>,
    /// Global-norm clipping threshold, if set.
    pub clip_grad_norm: Option<f32>,
    /// Whether updates round bf16 parameters (pure bf16) stochastically instead of to
    /// nearest, so that updates below half a bf16 ulp still move them on average.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stochastic_rounding: bool,
    /// LoRA adapters on the model's weights, the model itself frozen (`lora = lora(...)`
    /// or `--lora`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<crate::passes::lora::LoraSpec>,
    /// How frozen matmul weights are stored (`quantize_frozen = nf4` or
    /// `--quantize-frozen`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantize_frozen: Option<crate::ops::quant::Scheme>,
    /// What lives in the host arena instead of the device arena (`offload = optimizer` or
    /// `--offload`); None keeps everything on the device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offload: Option<Offload>,
    /// Whether the arena is CUDA unified memory (`unified = true` or `--unified`): the plan
    /// is the one planned without the budget's checkpointing, and `report.unified` says what
    /// of it would be resident on the device and where its page faults would fall, the
    /// budget (or the GPU's memory) taken as the device's capacity.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unified: bool,
    /// Data parallelism with ZeRO (`parallel = (data = N, zero = K)` or `--parallel`);
    /// None runs the step on one device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel: Option<crate::parallel::Parallel>,
}

/// What a plan keeps in host memory, beside the device arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Offload {
    /// The optimizer state, updated on the host as ZeRO-Offload does: each gradient and
    /// parameter is copied to the host, updated there, and the parameter copied back.
    Optimizer,
    /// The activations backward reads: each copied to the host after its forward producer
    /// and back to the device before its first backward reader
    /// (`passes::offload_activations`).
    Activations,
    /// Both the optimizer state and the saved activations.
    All,
    /// Nothing: everything stays on the device, decided (`none`), so the planner does not
    /// weigh offload ([`crate::compile_or_offload`]).
    #[serde(rename = "none")]
    Nothing,
}

impl Offload {
    /// The setting a word names (`optimizer`, `activations`, `all`, `none`), as `--offload` and
    /// `train { offload }` spell it; None for any other word.
    pub fn parse(word: &str) -> Option<Offload> {
        match word {
            "optimizer" => Some(Offload::Optimizer),
            "activations" => Some(Offload::Activations),
            "all" => Some(Offload::All),
            "none" => Some(Offload::Nothing),
            _ => None,
        }
    }

    /// The word that names this setting (`optimizer`, `activations`, `all`): what
    /// [`Offload::parse`] reads back.
    pub fn word(self) -> &'static str {
        match self {
            Offload::Optimizer => "optimizer",
            Offload::Activations => "activations",
            Offload::All => "all",
            Offload::Nothing => "none",
        }
    }

    /// What this setting keeps in host memory, in words.
    pub fn what(self) -> &'static str {
        match self {
            Offload::Optimizer => "the optimizer state",
            Offload::Activations => "the saved activations",
            Offload::All => "the optimizer state and the saved activations",
            Offload::Nothing => "nothing",
        }
    }

    /// Whether anything lives on the host.
    pub fn any(self) -> bool {
        self.optimizer() || self.activations()
    }

    /// Whether the optimizer state lives on the host.
    pub fn optimizer(self) -> bool {
        matches!(self, Offload::Optimizer | Offload::All)
    }

    /// Whether the saved activations wait on the host between forward and backward.
    pub fn activations(self) -> bool {
        matches!(self, Offload::Activations | Offload::All)
    }

    /// What to write instead of a word [`Offload::parse`] refuses.
    pub const HELP: &'static str = "use `optimizer` (the optimizer state lives in host memory \
         and the update runs on the host), `activations` (what backward reads waits in host \
         memory between forward and backward), `all` (both) or `none` (everything on the \
         device, offload not weighed against checkpointing)";
}

fn yes() -> bool {
    true
}

fn one() -> u32 {
    1
}
