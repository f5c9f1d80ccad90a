//! CUDA lowering of the losses onto `loss.cu`: cross-entropy and MSE (two-stage: fp64
//! partials of up to [`PARTIAL_BLOCKS`] blocks in the workspace, summed in a fixed order by a
//! finishing block) and their elementwise backwards; the fused linear cross-entropy's lowering
//! (cuBLASLt GEMMs over chunks of logits) is in `linear_ce_cuda.rs`.

use crate::codegen::build::{c_type, c_u64};
use crate::codegen::geometry::{numel, pow2_block, split, u, PARTIAL_BLOCKS};
use crate::codegen::launch::{templated, two_stage, Launch};
use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel, KernelParam};
use crate::ir::{Op, TensorType};
use crate::ops::cuda::CudaLowering;

/// `loss.cu`: the cross-entropy and MSE templates and their backwards.
const TEMPLATE: &str = include_str!("loss.cu");

/// Elements an MSE block sums at least: 8 per thread of a 256-thread block.
const MSE_MIN_CHUNK: u64 = 8 * 256;

/// Blocks of the cross-entropy's first launch: one per row, at most [`PARTIAL_BLOCKS`].
fn ce_parts(rows: u64) -> u64 {
    rows.clamp(1, PARTIAL_BLOCKS)
}

/// The two-stage loss kernel `template` over inputs `in0`, `in1` with constants `lines`, its
/// first launch over `parts` blocks of `block` threads (its `Cfg` also gets `PARTS`).
fn scalar_loss(
    a: &Args,
    family: &'static str,
    template: &str,
    mut lines: Vec<String>,
    (parts, block): (u64, u32),
) -> Result<Kernel, CodegenError> {
    lines.push(c_u64("PARTS", parts));
    let call = format!(
        "{template}<{}, Cfg>(arena, in0, in1, out, ws, phase)",
        a.ty(0)?
    );
    let params = [
        KernelParam::Input(0),
        KernelParam::Input(1),
        KernelParam::Output,
    ];
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
            Op::CrossEntropy => {
                let (rows, cl) = rows_classes(&a.at(0)?.shape);
                scalar_loss(
                    a,
                    "cross_entropy",
                    "cross_entropy_kernel",
                    vec![c_u64("ROWS", rows), c_u64("CL", cl)],
                    (ce_parts(rows), pow2_block(cl, 32, 256)),
                )
            }
            Op::CrossEntropyBackward => {
                let (rows, cl) = rows_classes(&a.at(0)?.shape);
                Ok(templated(
                    "cross_entropy_backward",
                    &[TEMPLATE],
                    vec![c_u64("ROWS", rows), c_u64("CL", cl), c_type("TL", a.ty(2)?)],
                    ("cross_entropy_backward_kernel", &[a.ty(0)?], 3),
                    Launch::PerBlock(rows, pow2_block(cl, 32, 256)),
                ))
            }
            Op::Mse => {
                let n = a.at(0)?.numel();
                let (parts, chunk) = split(n, MSE_MIN_CHUNK, PARTIAL_BLOCKS);
                scalar_loss(
                    a,
                    "mse",
                    "mse_kernel",
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
            Op::CrossEntropy => {
                let (rows, _) = inputs.first().map_or((0, 1), |t| rows_classes(&t.shape));
                ce_parts(rows) * 8
            }
            Op::Mse => split(numel(0), MSE_MIN_CHUNK, PARTIAL_BLOCKS).0 * 8,
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
