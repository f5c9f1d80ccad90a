//! Optimizer updates and the reductions they need: clipping, loss scaling, accumulation.

mod backward;
mod cpu;
mod cuda;
mod rules;

use serde::{Deserialize, Serialize};

/// The optimizer family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}

/// AdamW hyper-parameters, as `torch.optim.AdamW`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdamWParams {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
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
        }
    }
}

/// SGD hyper-parameters, as `torch.optim.SGD` (no dampening, no nesterov).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SgdParams {
    pub lr: f32,
    pub momentum: f32,
    pub weight_decay: f32,
}
