//! CUDA code generation for memc IR ops: one [`Kernel`] (source, entry point, launch
//! geometry and argument list) per op application, instantiated from the template beside
//! each op family (`src/ops/<family>/*.cu`, after the shared `kernels/prelude.cuh`) with the
//! shapes baked in as compile-time constants. Each family lowers its own ops
//! (`src/ops/<family>/cuda.rs`); this module holds the toolkit they share: source assembly
//! (`build`), shape arithmetic (`geometry`) and kernel shapes and launches (`launch`).
//!
//! Every kernel takes one `char* arena` base pointer followed by `unsigned long long` byte
//! offsets of its tensors (inputs in op order, then the output) and, for dropout and the
//! optimizers, the step counter (gradient accumulation: the micro-step), and for the few
//! kernels that need scratch, the offset of the step's planned workspace. Nothing allocates.
//!
//! Reductions over a whole tensor are two-stage: a first launch over many blocks writes one
//! partial per block into the workspace, a finishing launch of the same entry
//! ([`Kernel::finish`], [`KernelParam::Phase`] 1) sums them in a fixed order, so results do
//! not depend on how blocks are scheduled. Kernels reading a list of tensors whose length
//! grows with the model (the clip coefficient, the overflow check) take it as a
//! [`TensorTable`] the host writes at the start of their workspace before each launch.

pub(crate) mod build;
pub mod gemm;
pub(crate) mod geometry;
pub(crate) mod launch;
pub mod nvrtc;
pub mod ops;

use crate::ir::DType;
pub use build::{Kernel, TensorTable};
pub use ops::kernel_for;

/// One kernel argument, in signature order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelParam {
    /// The `char*` arena base pointer; always the first argument.
    Arena,
    /// `unsigned long long` byte offset into the arena of the op's input with this index.
    Input(usize),
    /// `unsigned long long` byte offset into the arena of the op's output.
    Output,
    /// `unsigned long long` 1-based training step (AdamW/SGD bias correction and momentum).
    Step,
    /// `unsigned long long` dropout stream: the 1-based count of micro-steps run so far (the
    /// training step when nothing accumulates).
    Stream,
    /// `unsigned long long` 0-based micro-step within the step (gradient accumulation).
    MicroStep,
    /// `unsigned long long` byte offset into the arena of the step's workspace (as many bytes
    /// as [`crate::plan::Target::workspace_bytes`] gives; its contents are undefined on entry).
    Workspace,
    /// `unsigned long long` 0 on a kernel's first launch, 1 on its finishing launch
    /// ([`Kernel::finish`]); for a kernel launched by [`gemm::Call::Launch`], the call's phase.
    Phase,
    /// `unsigned long long` the chunk a [`gemm::Call::Launch`] works on.
    Chunk,
}

/// Why no kernel could be generated or compiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodegenError {
    /// The input/output types are invalid for the op (or disagree with shape inference).
    #[error("`{op}`: {message}")]
    Type { op: &'static str, message: String },
    /// The op is valid but exceeds what the templates support (e.g. a grid dimension).
    #[error("`{op}` unsupported: {message}")]
    Unsupported { op: &'static str, message: String },
    /// The NVRTC shared library could not be loaded.
    #[error("NVRTC not found: libnvrtc.so is on no library path (put the CUDA toolkit's lib64, or the nvidia-cuda-nvrtc wheel's lib, on LD_LIBRARY_PATH; scripts/cuda-env does)")]
    NvrtcMissing,
    /// NVRTC loads but `cuda_fp16.h` / `cuda_bf16.h` were found nowhere
    /// ([`nvrtc::cuda_include_dir`]).
    #[error("CUDA headers cuda_fp16.h and cuda_bf16.h not found beside NVRTC, in $CUDA_HOME or /usr/local/cuda (set MEMC_CUDA_INCLUDE to their directory; the nvidia-cuda-runtime wheel has them)")]
    HeadersMissing,
    /// An architecture other than compute_80 / compute_90 was requested.
    #[error("unsupported architecture `{0}` (use compute_80 or compute_90)")]
    Arch(String),
    /// NVRTC rejected the source; `log` is its compile log.
    #[error("NVRTC failed to compile `{name}`: {log}")]
    Compile { name: String, log: String },
}

/// The CUDA spelling of an element type (`float`, `__half`, `__nv_bfloat16`, `int`,
/// `unsigned char`).
pub fn ctype(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float",
        DType::F16 => "__half",
        DType::BF16 => "__nv_bfloat16",
        DType::I32 => "int",
        DType::U8 => "unsigned char",
    }
}

/// The `cast` kernel converting `numel` contiguous elements from `from` to `to` (through fp32,
/// round-to-nearest-even when narrowing); arguments: arena, input offset, output offset.
pub fn cast_kernel(from: DType, to: DType, numel: u64) -> Kernel {
    crate::ops::cast::Family::kernel(from, to, numel)
}

/// The distinct kernels of a plan's device steps, in first-use order, with the step indices
/// that launch each (copies between the tiers and host updates launch none).
pub fn plan_kernel_uses(
    plan: &crate::plan::Plan,
) -> Result<Vec<(Kernel, Vec<usize>)>, CodegenError> {
    let mut out: Vec<(Kernel, Vec<usize>)> = Vec::new();
    for (s, step) in plan.steps.iter().enumerate() {
        if !plan.launches(step) || plan.placement(step) != crate::plan::Placement::Device {
            continue;
        }
        let inputs: Vec<crate::ir::TensorType> = step
            .inputs
            .iter()
            .map(|b| plan.buffers[b.index()].ty.clone())
            .collect();
        let refs: Vec<&crate::ir::TensorType> = inputs.iter().collect();
        let output = match step.output {
            Some(b) => plan.buffers[b.index()].ty.clone(),
            None => crate::ir::infer::infer(&step.op, &refs).map_err(|e| CodegenError::Type {
                op: step.op.name(),
                message: e.message,
            })?,
        };
        let Some(kernel) = kernel_for(&step.op, &inputs, &output)? else {
            continue;
        };
        match out.iter_mut().find(|(k, _)| k.name == kernel.name) {
            Some((_, uses)) => uses.push(s),
            None => out.push((kernel, vec![s])),
        }
    }
    Ok(out)
}

/// The distinct kernels of a plan, in first-use order.
pub fn plan_kernels(plan: &crate::plan::Plan) -> Result<Vec<Kernel>, CodegenError> {
    Ok(plan_kernel_uses(plan)?
        .into_iter()
        .map(|(k, _)| k)
        .collect())
}
