//! Backends that execute a verified plan, and the file formats they exchange.
pub mod adapters;
pub mod cpu;
pub mod cublaslt;
pub mod cuda;
pub mod io;
pub mod kernels;
pub mod lowp;
pub mod quantized;
pub mod state;

use std::fmt;

/// Called before each update with the parameter name and its complete gradient.
pub type GradientHook<'a> = &'a mut dyn FnMut(&str, &[f32]);

/// Why a plan could not run: bad data reached a kernel, or the plan needs what the backend lacks.
#[derive(Debug, Clone, PartialEq)]
pub enum ExecError {
    IdOutOfRange {
        value: i64,
        limit: usize,
    },
    Shape(String),
    Unsupported(String),
    /// The device or its driver failed (or is absent).
    Device(String),
}

impl fmt::Display for ExecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExecError::IdOutOfRange { value, limit } => {
                write!(f, "id {value} is out of range 0..{limit}")
            }
            ExecError::Shape(m) | ExecError::Unsupported(m) | ExecError::Device(m) => {
                f.write_str(m)
            }
        }
    }
}

impl std::error::Error for ExecError {}
