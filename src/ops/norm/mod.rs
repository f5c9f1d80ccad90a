//! Layer, RMS, batch and group normalization with their affine parameters.

mod backward;
mod cpu;
mod cuda;
mod rules;

use serde::{Deserialize, Serialize};

/// The norm family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}

/// A normalization: which elements share statistics and which axis carries the affine
/// parameters. Layer and Rms normalize over the last axis (params sized by it); Batch
/// normalizes each channel (axis 1) over batch and space with batch statistics; Group(g)
/// normalizes each sample's groups of channels over those channels and space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormKind {
    Layer,
    Rms,
    Batch,
    Group(usize),
}
