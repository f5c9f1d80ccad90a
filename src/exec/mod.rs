//! Backends that execute a verified plan.
pub mod kernels;
