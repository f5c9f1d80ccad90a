//! Softmax and log-softmax along one axis.

mod backward;
mod cpu;
mod cuda;
mod rules;

/// The softmax family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}
