//! Backends that execute a verified plan, and the file formats they exchange.
pub mod adapters;
pub mod cpu;
pub mod cublaslt;
pub mod cuda;
pub mod group;
pub mod io;
pub mod kernels;
pub mod lowp;
pub mod mailbox;
pub mod quantized;
pub mod ranks;
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

/// Why the CUDA backend refuses a data-parallel plan, and what to do instead.
pub const PARALLEL_ON_CUDA: &str = "the CUDA backend does not run data-parallel plans yet \
     (their collectives have no NCCL mapping): run all ranks with --device cpu, or compile \
     with --device cuda to read each rank's device bytes";

/// Whether the CUDA backend (and `memc emit`'s kernels) can take `plan` on a machine whose
/// CUDA driver is `driver` present: not without a driver, not for a data-parallel plan,
/// whose collectives only the CPU
/// backend's in-process group runs, and not for a plan built for the CPU backend, whose
/// scratch buffers are sized for the CPU kernels (the CUDA lowerings need others).
pub fn cuda_can_run(plan: &crate::plan::Plan, driver: bool) -> Result<(), ExecError> {
    if plan.target == crate::plan::Target::Cpu {
        return Err(ExecError::Unsupported(
            "the plan was built for the CPU backend: its ops' scratch buffers are sized for \
             the CPU kernels, not the CUDA ones; compile the .mdl with --device cuda"
                .into(),
        ));
    }
    if plan.report.parallel.is_some() {
        return Err(ExecError::Unsupported(PARALLEL_ON_CUDA.into()));
    }
    if !driver {
        return Err(ExecError::Device("no CUDA driver found".to_string()));
    }
    Ok(())
}
