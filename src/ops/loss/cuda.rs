//! CUDA lowering of the losses onto `loss.cu`: cross-entropy and MSE (one block, fixed
//! order) and their elementwise backwards; and of the fused linear cross-entropy onto
//! `linear_ce.cu` (a block per row forward and for the input gradient, column tiles summed in
//! a workspace for the weight gradient).

use crate::codegen::build::{c_bool, c_type, c_u64};
use crate::codegen::geometry::{numel, pow2_block, u};
use crate::codegen::launch::{in_names, single, templated, Launch};
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
                Ok(templated(
                    "cross_entropy",
                    &[TEMPLATE],
                    vec![c_u64("ROWS", rows), c_u64("CL", cl)],
                    ("cross_entropy_kernel", &[a.ty(0)?], 2),
                    Launch::Grid([1, 1, 1], pow2_block(cl, 32, 1024)),
                ))
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
            Op::Mse => Ok(templated(
                "mse",
                &[TEMPLATE],
                vec![c_u64("N", a.at(0)?.numel())],
                ("mse_kernel", &[a.ty(0)?], 2),
                Launch::Grid([1, 1, 1], 1024),
            )),
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

    /// The weight gradient of the linear cross-entropy sums its column tiles in fp32 there:
    /// `blocks x 32 x D x 4` bytes, as many tiles as one chunk of fp32 logits holds (at least
    /// one).
    fn cuda_workspace_bytes(&self, op: &Op, inputs: &[&TensorType], _: &TensorType) -> u64 {
        let Op::LinearCrossEntropyBackward {
            lce,
            which: LceGrad::Weight,
        } = op
        else {
            return 0;
        };
        super::rules::linear_ce(lce, inputs).map_or(0, |(n, d, v)| {
            weight_blocks(lce, (n, d, v)) * WEIGHT_TILE.0 * d * 4
        })
    }
}
