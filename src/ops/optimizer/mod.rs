//! Optimizer updates and the reductions they need: clipping, loss scaling, accumulation.

mod backward;
mod cpu;
mod cuda;
pub mod quantize;
mod rules;

use serde::{Deserialize, Serialize};

/// The most parameters one AdamW group steps (`Op::AdamWGroup`).
pub const MAX_GROUP: usize = 512;

/// What an update op steps, from its inputs: each parameter (or the shard or host copy it
/// writes), its gradient and the inputs after them that belong to it (its state, and for
/// AdamW and SGD the multiplier); one entry for AdamW and SGD, one a parameter of an AdamW
/// group, none for any other op.
pub fn stepped<'a, T: Copy>(op: &crate::ir::Op, inputs: &'a [T]) -> Vec<(T, T, &'a [T])> {
    use crate::ir::Op;
    match op {
        Op::AdamW(_) | Op::Sgd(_) if inputs.len() >= 2 => {
            vec![(inputs[0], inputs[1], &inputs[2..])]
        }
        Op::AdamWGroup { tensors, .. } => (inputs.chunks_exact(4))
            .take(*tensors as usize)
            .map(|q| (q[0], q[1], &q[2..]))
            .collect(),
        _ => Vec::new(),
    }
}

/// The optimizer family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}

/// AdamW hyper-parameters, as `torch.optim.AdamW`, with how its moments are stored and how
/// the updated parameter is rounded.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdamWParams {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// How the two moments are stored (`adamw(state = int8)`); fp32 when absent.
    #[serde(default, skip_serializing_if = "StateFormat::is_fp32")]
    pub state: StateFormat,
    /// How a bf16 parameter is rounded after its update; nearest when absent.
    #[serde(default, skip_serializing_if = "Rounding::is_nearest")]
    pub rounding: Rounding,
}

/// How AdamW stores its moments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StateFormat {
    /// Two f32 tensors of the parameter's shape: 8 bytes a parameter.
    #[default]
    Fp32,
    /// Each moment as one u8 code an element and one f32 absmax per block of
    /// [`quantize::BLOCK`] elements ([`quantize`]): 2 bytes a parameter and 8 per block.
    Int8,
}

impl StateFormat {
    /// True for the fp32 moments (the default, left out of serialized plans).
    pub fn is_fp32(&self) -> bool {
        *self == StateFormat::Fp32
    }

    /// The spelling `state = ...` and `--optimizer-state` take (`fp32`, `int8`).
    pub fn parse(text: &str) -> Option<StateFormat> {
        match text {
            "fp32" => Some(StateFormat::Fp32),
            "int8" => Some(StateFormat::Int8),
            _ => None,
        }
    }
}

/// How an update stores a parameter held in bf16 (pure bf16, `master_weights = off`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rounding {
    /// To the nearest bf16, ties to even (what every other store does).
    #[default]
    Nearest,
    /// Up or down to a bf16 neighbour with probability proportional to the nearness
    /// ([`quantize::round_bf16_stochastic`]), the random bits keyed by the run's dropout
    /// stream (seed and step), this `key` (the parameter's position) and the element.
    Stochastic { key: u64 },
}

impl Rounding {
    /// True for round-to-nearest (the default, left out of serialized plans).
    pub fn is_nearest(&self) -> bool {
        *self == Rounding::Nearest
    }
}

/// The state inputs an AdamW update with moments stored as `state` takes after the parameter
/// and the gradient: `(m, v)` in f32, or `(m codes, v codes, m absmax, v absmax)` in 8 bits.
pub fn adamw_states(state: StateFormat) -> usize {
    match state {
        StateFormat::Fp32 => 2,
        StateFormat::Int8 => 4,
    }
}

impl Default for AdamWParams {
    /// `torch.optim.AdamW`'s defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01.
    fn default() -> Self {
        AdamWParams {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            state: StateFormat::Fp32,
            rounding: Rounding::Nearest,
        }
    }
}

/// SGD hyper-parameters, as `torch.optim.SGD` (no dampening, no nesterov), with how the
/// updated parameter is rounded.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SgdParams {
    pub lr: f32,
    pub momentum: f32,
    pub weight_decay: f32,
    /// How a bf16 parameter is rounded after its update; nearest when absent.
    #[serde(default, skip_serializing_if = "Rounding::is_nearest")]
    pub rounding: Rounding,
}
