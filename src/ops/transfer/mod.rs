//! Copies between the two memory tiers of a plan, the device arena and the host arena
//! (`--offload`): a value copied to the host, a host value copied back into a device buffer
//! in place, and a host value copied into a new device buffer. They move bytes unchanged, so a plan with them computes bit for bit what
//! the plan without them computes.

mod backward;
mod cpu;
mod cuda;
mod rules;

/// The transfer family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}
