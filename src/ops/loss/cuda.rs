//! CUDA lowering of the losses onto `loss.cu`: cross-entropy and MSE (two-stage: fp64
//! partials of up to [`PARTIAL_BLOCKS`] blocks in the workspace, summed in a fixed order by a
//! finishing block), their elementwise backwards and the count of kept rows (one block); the
//! fused linear cross-entropy's lowering (cuBLASLt GEMMs over chunks of logits) is in
//! `linear_ce_cuda.rs`.

use crate::codegen::build::{c_bool, c_int, c_type, c_u64};
use crate::codegen::geometry::{numel, pow2_block, split, u, PARTIAL_BLOCKS};
use crate::codegen::launch::{in_names, templated, two_stage, Launch};
use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel, KernelParam};
use crate::ir::{CeParams, Op, TensorType};
use crate::ops::cuda::CudaLowering;

/// `loss.cu`: the cross-entropy and MSE templates, their backwards, the count of kept rows,
/// and `ce_kept`, which rows a cross-entropy takes (the fused head's kernels include it too).
pub(super) const TEMPLATE: &str = include_str!("loss.cu");

/// The `Cfg` lines of which rows a cross-entropy takes: `HAS_IGNORE` and `IGNORE`.
pub(super) fn ce_lines(ce: &CeParams) -> [String; 2] {
    [
        c_bool("HAS_IGNORE", ce.ignore_index.is_some()),
        c_int("IGNORE", ce.ignore_index.map_or(0, i64::from)),
    ]
}

/// Elements an MSE or kept-count block takes at least: 8 per thread of a 256-thread block.
const MIN_CHUNK: u64 = 8 * 256;

/// Blocks of the cross-entropy's first launch: one per row, at most [`PARTIAL_BLOCKS`].
fn ce_parts(rows: u64) -> u64 {
    rows.clamp(1, PARTIAL_BLOCKS)
}

/// The two-stage loss kernel `template` over its first `n_in` inputs with constants `lines`,
/// its first launch over `parts` blocks of `block` threads (its `Cfg` also gets `PARTS`).
fn scalar_loss(
    a: &Args,
    (family, template, n_in): (&'static str, &str, usize),
    mut lines: Vec<String>,
    (parts, block): (u64, u32),
) -> Result<Kernel, CodegenError> {
    lines.push(c_u64("PARTS", parts));
    let call = format!(
        "{template}<{}, Cfg>(arena, {}, out, ws, phase)",
        a.ty(0)?,
        in_names(n_in).join(", ")
    );
    let mut params: Vec<KernelParam> = (0..n_in).map(KernelParam::Input).collect();
    params.push(KernelParam::Output);
    Ok(two_stage(
        family,
        &[TEMPLATE],
        lines,
        call,
        &params,
        ([parts, 1, 1], block),
        1,
    ))
}

/// (rows, classes) of logits `shape`: the last dim holds the classes.
fn rows_classes(shape: &[usize]) -> (u64, u64) {
    let cl = shape.last().map_or(1, |&c| u(c));
    (numel(shape).checked_div(cl).unwrap_or(0), cl)
}

impl CudaLowering for super::Family {
    fn lower(&self, a: &Args) -> Result<Kernel, CodegenError> {
        let n_out = a.output.numel();
        match a.op {
            Op::CrossEntropy(ce) => {
                let (rows, cl) = rows_classes(&a.at(0)?.shape);
                let mut lines = vec![c_u64("ROWS", rows), c_u64("CL", cl)];
                lines.extend(ce_lines(ce));
                scalar_loss(
                    a,
                    ("cross_entropy", "cross_entropy_kernel", ce.inputs(false)),
                    lines,
                    (ce_parts(rows), pow2_block(cl, 32, 256)),
                )
            }
            Op::CrossEntropyBackward(ce) => {
                let (rows, cl) = rows_classes(&a.at(0)?.shape);
                let mut lines = vec![c_u64("ROWS", rows), c_u64("CL", cl), c_type("TL", a.ty(2)?)];
                lines.extend(ce_lines(ce));
                Ok(templated(
                    "cross_entropy_backward",
                    &[TEMPLATE],
                    lines,
                    (
                        "cross_entropy_backward_kernel",
                        &[a.ty(0)?],
                        ce.inputs(true),
                    ),
                    Launch::PerBlock(rows, pow2_block(cl, 32, 256)),
                ))
            }
            // Chunks of targets over many blocks (a segmentation's are as many as its pixels).
            Op::KeptCount(ce) => {
                let rows = a.at(0)?.numel();
                let (parts, chunk) = split(rows, MIN_CHUNK, PARTIAL_BLOCKS);
                let mut lines = vec![c_u64("ROWS", rows), c_u64("CHUNK", chunk)];
                lines.extend(ce_lines(ce));
                scalar_loss(
                    a,
                    ("kept_count", "kept_count_kernel", 1),
                    lines,
                    (parts, 256),
                )
            }
            Op::Mse => {
                let n = a.at(0)?.numel();
                let (parts, chunk) = split(n, MIN_CHUNK, PARTIAL_BLOCKS);
                scalar_loss(
                    a,
                    ("mse", "mse_kernel", 2),
                    vec![c_u64("N", n), c_u64("CHUNK", chunk)],
                    (parts, 256),
                )
            }
            Op::MseBackward => Ok(templated(
                "mse_backward",
                &[TEMPLATE],
                vec![c_u64("N", n_out), c_type("TL", a.ty(2)?)],
                ("mse_backward_kernel", &[a.ty(0)?], 3),
                Launch::Elementwise(n_out),
            )),
            Op::LinearCrossEntropy(lce) => super::linear_ce_cuda::linear_ce(a, lce, None),
            Op::LinearCrossEntropyBackward { lce, which } => {
                super::linear_ce_cuda::linear_ce(a, lce, Some(*which))
            }
            _ => Err(a.foreign("loss")),
        }
    }

    /// The scalar losses keep one fp64 partial per block of their first launch there (8 bytes
    /// each); the linear cross-entropy its chunk of logits, their gradient and cuBLASLt's
    /// scratch (`linear_ce_cuda::workspace_bytes`).
    fn cuda_workspace_bytes(&self, op: &Op, inputs: &[&TensorType], _: &TensorType) -> u64 {
        let numel = |i: usize| inputs.get(i).map_or(0, |t| t.numel());
        match op {
            Op::CrossEntropy(_) => {
                let (rows, _) = inputs.first().map_or((0, 1), |t| rows_classes(&t.shape));
                ce_parts(rows) * 8
            }
            Op::Mse | Op::KeptCount(_) => split(numel(0), MIN_CHUNK, PARTIAL_BLOCKS).0 * 8,
            Op::LinearCrossEntropy(lce) => {
                super::linear_ce_cuda::workspace_bytes(lce, None, inputs)
            }
            Op::LinearCrossEntropyBackward { lce, which } => {
                super::linear_ce_cuda::workspace_bytes(lce, Some(*which), inputs)
            }
            _ => 0,
        }
    }
}
