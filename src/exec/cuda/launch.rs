//! Issuing a step's work on the device: loading each kernel's image, resolving its library
//! calls' addresses against the arena once, and launching with the arena base and the
//! plan's byte offsets.

use super::{device_error, CudaExecutor, Issue};
use crate::codegen::gemm::{Addr, Call};
use crate::codegen::{nvrtc, Kernel, KernelParam};
use crate::exec::cublaslt::{Lt, PreparedGemm};
use crate::exec::ExecError;
use crate::plan::{BufferId, Plan};
use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};

/// A library call of a step with its addresses resolved.
pub(super) enum Prepared {
    Gemm(PreparedGemm),
    Launch {
        grid: [u32; 3],
        phase: u64,
        chunk: u64,
    },
}

/// The image of `kernel` the driver loads: a CUBIN for the device's compute capability
/// `sm`, or PTX for `arch` where this NVRTC cannot target `sm` (the driver then JIT-compiles
/// it). NVRTC or the CUDA headers missing is a device error naming what is missing.
pub(super) fn image(
    kernel: &Kernel,
    sm: (u32, u32),
    arch: &str,
) -> Result<cudarc::nvrtc::Ptx, ExecError> {
    use crate::codegen::CodegenError;
    let missing = |e: CodegenError| match e {
        CodegenError::NvrtcMissing | CodegenError::HeadersMissing => {
            ExecError::Device(e.to_string())
        }
        other => ExecError::Unsupported(other.to_string()),
    };
    match nvrtc::compile_cubin(kernel, sm) {
        Ok(cubin) => Ok(cudarc::nvrtc::Ptx::from_binary(cubin.image)),
        Err(CodegenError::Compile { .. }) => nvrtc::compile_ptx(kernel, arch)
            .map(cudarc::nvrtc::Ptx::from_src)
            .map_err(missing),
        Err(e) => Err(missing(e)),
    }
}

impl CudaExecutor {
    /// Issues plan step `s`'s work (kernel `k`) as `at` says: its library calls in order,
    /// or its launch and finishing launch.
    pub(super) fn launch_step(&self, s: usize, k: usize, at: Issue) -> Result<(), ExecError> {
        let (kernel, function) = &self.kernels[k];
        let launch =
            |grid, phase_chunk| self.launch(s, (function.as_ref(), kernel), grid, phase_chunk, at);
        let Some(calls) = self.calls.get(s).filter(|c| !c.is_empty()) else {
            let phases = [Some(kernel.grid), kernel.finish];
            for (phase, grid) in phases.into_iter().enumerate() {
                if let Some(grid) = grid {
                    launch(grid, (phase as u64, 0))?;
                }
            }
            return Ok(());
        };
        for call in calls {
            match call {
                Prepared::Gemm(g) => {
                    let lt = self
                        .lt
                        .as_ref()
                        .ok_or_else(|| ExecError::Device("cuBLASLt is not open".to_string()))?;
                    // SAFETY: the addresses were resolved from the plan's verified offsets
                    // inside the arena, which lives as long as `self`.
                    unsafe { lt.run(g, self.stream.cu_stream() as *mut _) }?;
                }
                Prepared::Launch { grid, phase, chunk } => launch(*grid, (*phase, *chunk))?,
            }
        }
        Ok(())
    }

    /// Launches step `s`'s kernel over `grid` with the given (phase, chunk), as `at` says.
    fn launch(
        &self,
        s: usize,
        (function, kernel): (Option<&CudaFunction>, &Kernel),
        [gx, gy, gz]: [u32; 3],
        (phase, chunk): (u64, u64),
        at: Issue,
    ) -> Result<(), ExecError> {
        let step = &self.plan.steps[s];
        let function = function
            .ok_or_else(|| ExecError::Device(format!("`{}` has no code to launch", kernel.name)))?;
        let offset = |b: BufferId| self.plan.buffers[b.index()].offset;
        let workspace = step.workspace.map_or(0, offset);
        let values: Vec<u64> = kernel.params[1..]
            .iter()
            .map(|p| match p {
                KernelParam::Input(i) => offset(step.inputs[*i]),
                KernelParam::Output => step.output.map_or(0, offset),
                KernelParam::Step => at.number,
                KernelParam::Stream => at.stream,
                KernelParam::MicroStep => u64::from(at.micro),
                KernelParam::Workspace => workspace,
                KernelParam::Phase => phase,
                KernelParam::Chunk => chunk,
                KernelParam::Arena => 0,
            })
            .collect();
        let mut launch = self.stream.launch_builder(function);
        launch.arg(&self.base);
        for v in &values {
            launch.arg(v);
        }
        let [bx, by, bz] = kernel.block;
        let cfg = LaunchConfig {
            grid_dim: (gx, gy, gz),
            block_dim: (bx, by, bz),
            shared_mem_bytes: kernel.shared_bytes,
        };
        // SAFETY: the entry's signature is `char*` (the arena's base address, pushed as its
        // 8-byte value) followed by one `unsigned long long` per remaining `kernel.params`
        // entry, exactly the arguments pushed above; every
        // offset is a buffer the plan verifier placed inside the arena (a kernel's table
        // fits its workspace: the lowering counts it in).
        unsafe { launch.launch(cfg) }.map_err(device_error)?;
        Ok(())
    }
}

/// Every step's library calls with device addresses resolved against the arena at `base`, GEMMs
/// prepared with cuBLASLt (empty lists for plain launches).
pub(super) fn prepare_calls(
    plan: &Plan,
    kernels: &[(Kernel, Option<CudaFunction>)],
    kernel_of: &[Option<usize>],
    lt: &Lt,
    base: u64,
) -> Result<Vec<Vec<Prepared>>, ExecError> {
    let mut out = Vec::with_capacity(plan.steps.len());
    for (step, k) in plan.steps.iter().zip(kernel_of) {
        let Some(kernel) = k.map(|k| &kernels[k].0) else {
            out.push(Vec::new());
            continue;
        };
        let offset = |b: BufferId| plan.buffers[b.index()].offset;
        let workspace = step
            .workspace
            .map(|b| (offset(b), plan.buffers[b.index()].bytes));
        let addr = |a: Addr| -> Result<u64, ExecError> {
            let missing =
                || ExecError::Unsupported(format!("`{}`: no buffer for {a:?}", kernel.name));
            Ok(base
                + match a {
                    Addr::Input(i, plus) => offset(*step.inputs.get(i).ok_or_else(missing)?) + plus,
                    Addr::Output(plus) => offset(step.output.ok_or_else(missing)?) + plus,
                    Addr::Workspace(plus) => workspace.ok_or_else(missing)?.0 + plus,
                })
        };
        // cuBLASLt's scratch: whatever of the workspace the step's kernel does not use.
        let (ws_at, ws_bytes) = workspace.unwrap_or((0, 0));
        let own = kernel.library_workspace_from.min(ws_bytes);
        let scratch = (base + ws_at + own, (ws_bytes - own) as usize);
        let mut calls = Vec::with_capacity(kernel.library.len());
        for call in &kernel.library {
            calls.push(match call {
                Call::Gemm(g) => {
                    let ptrs = [addr(g.a.at)?, addr(g.b.at)?, addr(g.d.at)?];
                    let vector = g.epilogue_vector().map(|v| addr(v.at)).transpose()?;
                    Prepared::Gemm(lt.prepare(g, ptrs, vector, scratch)?)
                }
                Call::Launch {
                    grid, phase, chunk, ..
                } => Prepared::Launch {
                    grid: *grid,
                    phase: *phase,
                    chunk: *chunk,
                },
            });
        }
        out.push(calls);
    }
    Ok(out)
}
