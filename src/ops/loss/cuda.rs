//! CUDA lowering of the losses onto `loss.cu`: cross-entropy and MSE (two-stage: fp64
//! partials of up to [`PARTIAL_BLOCKS`] blocks in the workspace, summed in a fixed order by a
//! finishing block) and their elementwise backwards; and of the fused linear cross-entropy onto
//! `linear_ce.cu` (a block per row forward and for the input gradient, column tiles summed in
//! a workspace for the weight gradient).

use crate::codegen::build::{c_bool, c_type, c_u64};
use crate::codegen::geometry::{numel, pow2_block, split, u, PARTIAL_BLOCKS};
use crate::codegen::launch::{in_names, single, templated, two_stage, Launch};
use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel, KernelParam};
use crate::ir::{LceGrad, LinearCe, Op, TensorType};
use crate::ops::cuda::CudaLowering;

/// `loss.cu`: the cross-entropy and MSE templates and their backwards.
const TEMPLATE: &str = include_str!("loss.cu");

/// `linear_ce.cu`: the fused linear cross-entropy and its two backwards.
const LINEAR_TEMPLATE: &str = include_str!("linear_ce.cu");

/// Columns per tile of the weight-gradient kernel, and rows whose logits' gradient it stages
/// in shared memory at a time.
const WEIGHT_TILE: (u64, u64) = (32, 32);

/// Most dx elements one thread of the input-gradient kernel accumulates.
const MAX_PER_THREAD: u64 = 16;

/// Blocks of the weight-gradient kernel for `(rows, dim, classes)`: as many fp32 tiles of
/// `VT x dim` sums as fit in the bytes of one chunk of fp32 logits (`chunk x classes x 4`),
/// at least one, at most one per tile.
fn weight_blocks(lce: &LinearCe, (rows, dim, classes): (u64, u64, u64)) -> u64 {
    let tiles = classes.div_ceil(WEIGHT_TILE.0).max(1);
    let chunk = u(lce.chunk).clamp(1, rows.max(1));
    (chunk * classes / (WEIGHT_TILE.0 * dim).max(1)).clamp(1, tiles)
}

/// The kernel of a linear cross-entropy op.
fn linear_ce(a: &Args, lce: &LinearCe, which: Option<LceGrad>) -> Result<Kernel, CodegenError> {
    let refs: Vec<&TensorType> = a.inputs.iter().collect();
    let (n, d, v) = super::rules::linear_ce(lce, &refs).map_err(|e| a.err(e.message))?;
    let mut lines = vec![
        c_u64("N", n),
        c_u64("D", d),
        c_u64("V", v),
        c_bool("TR", lce.transposed),
    ];
    let ty = [a.ty(0)?];
    match which {
        None => Ok(templated(
            "linear_ce",
            &[LINEAR_TEMPLATE],
            lines,
            ("lce_forward_kernel", &ty, 3),
            Launch::PerBlock(n, pow2_block(v, 32, 256)),
        )),
        Some(LceGrad::Input) => {
            let block = pow2_block(d.div_ceil(MAX_PER_THREAD), 128, 1024);
            let per_thread = d.div_ceil(u64::from(block));
            if per_thread > MAX_PER_THREAD {
                return Err(a.unsupported(format!(
                    "hidden dim {d} exceeds {} per block",
                    MAX_PER_THREAD * 1024
                )));
            }
            lines.extend([c_u64("BLOCK", u64::from(block)), c_u64("DPT", per_thread)]);
            Ok(templated(
                "linear_ce",
                &[LINEAR_TEMPLATE],
                lines,
                ("lce_backward_input_kernel", &ty, 5),
                Launch::PerBlock(n, block),
            ))
        }
        Some(LceGrad::Weight) => {
            let (vt, rt) = WEIGHT_TILE;
            let blocks = weight_blocks(lce, (n, d, v));
            lines.extend([
                c_u64("VT", vt),
                c_u64("RT", rt),
                c_u64("TILES", v.div_ceil(vt)),
            ]);
            let mut args = in_names(5);
            args.extend(["out".to_string(), "ws".to_string()]);
            let mut params: Vec<KernelParam> = (0..5).map(KernelParam::Input).collect();
            params.extend([KernelParam::Output, KernelParam::Workspace]);
            let call = format!(
                "lce_backward_weight_kernel<{}, Cfg>(arena, {})",
                ty[0],
                args.join(", ")
            );
            Ok(single(
                "linear_ce",
                &[LINEAR_TEMPLATE],
                lines,
                call,
                &params,
                Launch::Grid([blocks, 1, 1], 256),
            ))
        }
    }
}

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
            Op::LinearCrossEntropy(lce) => linear_ce(a, lce, None),
            Op::LinearCrossEntropyBackward { lce, which } => linear_ce(a, lce, Some(*which)),
            _ => Err(a.foreign("loss")),
        }
    }

    /// The scalar losses keep one fp64 partial per block of their first launch there (8 bytes
    /// each); the weight gradient of the linear cross-entropy sums its column tiles in fp32
    /// there: `blocks x 32 x D x 4` bytes, as many tiles as one chunk of fp32 logits holds
    /// (at least one).
    fn cuda_workspace_bytes(&self, op: &Op, inputs: &[&TensorType], _: &TensorType) -> u64 {
        let numel = |i: usize| inputs.get(i).map_or(0, |t| t.numel());
        match op {
            Op::CrossEntropy => {
                let (rows, _) = inputs.first().map_or((0, 1), |t| rows_classes(&t.shape));
                ce_parts(rows) * 8
            }
            Op::Mse => split(numel(0), MSE_MIN_CHUNK, PARTIAL_BLOCKS).0 * 8,
            Op::LinearCrossEntropyBackward {
                lce,
                which: LceGrad::Weight,
            } => super::rules::linear_ce(lce, inputs).map_or(0, |(n, d, v)| {
                weight_blocks(lce, (n, d, v)) * WEIGHT_TILE.0 * d * 4
            }),
            _ => 0,
        }
    }
}
