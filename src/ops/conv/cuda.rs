//! CUDA lowering of the 2-D convolution and its input and weight gradients onto `conv.cu`:
//! implicit GEMMs on the tiled core of the matmul template, one GEMM batch per group.

use crate::codegen::build::c_u64;
use crate::codegen::geometry::{u, window_consts};
use crate::codegen::geometry::{FILL_BLOCKS, PARTIAL_BLOCKS};
use crate::codegen::launch::{gemm_launch, gemm_tiles, templated, two_stage, Launch};
use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel, KernelParam};
use crate::ir::{ConvParams, Op};
use crate::ops::cuda::CudaLowering;

/// `conv.cu`: the implicit-GEMM IO objects and entry templates (after `matmul.cu`).
const TEMPLATE: &str = include_str!("conv.cu");

/// Least K a split of the weight gradient sums (16 of the GEMM's K steps).
const MIN_SPLIT_K: u64 = 256;

/// Most bytes of fp32 partials the split weight gradient keeps in its workspace.
const MAX_PARTIALS: u64 = 64 << 20;

/// Splits of the weight gradient's K (`nb * ho * wo`) for `tiles` output tiles of a
/// `cog x nw` gradient per group over `g` groups: enough for [`FILL_BLOCKS`], each at least
/// [`MIN_SPLIT_K`] long, the partials within [`MAX_PARTIALS`]; 1 when no split is needed.
fn weight_splits(k: u64, tiles: u64, (g, cog, nw): (u64, u64, u64)) -> u64 {
    let by_fill = FILL_BLOCKS.div_ceil(tiles.max(1));
    let by_k = k / MIN_SPLIT_K;
    let by_bytes = MAX_PARTIALS / (g * cog * nw * 4).max(1);
    by_fill.min(by_k).min(by_bytes).max(1)
}

/// The weight gradient's workspace: its splits' fp32 partials (0 when it does not split).
fn weight_workspace(x: &[usize], dw: &[usize], dy: &[usize], groups: usize) -> u64 {
    let g = u(groups.max(1));
    let (cog, nw) = (u(dw[0]) / g, u(dw[1] * dw[2] * dw[3]));
    let k = u(x[0] * dy[2] * dy[3]);
    let (gx, gy) = gemm_tiles(cog, nw);
    let tiles = gx * gy * g;
    match weight_splits(k, tiles, (g, cog, nw)) {
        1 => 0,
        s => s * g * cog * nw * 4,
    }
}

/// A convolution-family implicit GEMM; `x`, `w`, `y` are the forward geometry's shapes. The
/// entry is `{family}_kernel`, templated on the first input's type (and the second's for the
/// backward kernels).
fn conv(
    a: &Args,
    family: &'static str,
    c: &ConvParams,
    x: &[usize],
    w: &[usize],
    y: &[usize],
) -> Result<Kernel, CodegenError> {
    let g = u(c.groups.max(1));
    let (nb, ci, h, wd) = (u(x[0]), u(x[1]), u(x[2]), u(x[3]));
    let (co, cig, kh, kw) = (u(w[0]), u(w[1]), u(w[2]), u(w[3]));
    let (ho, wo) = (u(y[2]), u(y[3]));
    let cog = co / g;
    let (m, n) = match family {
        "conv2d" => (cog, nb * ho * wo),
        "conv2d_backward_input" => (cig, nb * h * wd),
        _ => (cog, cig * kh * kw),
    };
    let launch = gemm_launch(a, m, n, g)?;
    let k = nb * ho * wo;
    let splits = match (family, &launch) {
        ("conv2d_backward_weight", Launch::Grid([gx, gy, gz], _)) => {
            weight_splits(k, gx * gy * gz, (g, cog, cig * kh * kw))
        }
        _ => 1,
    };
    let types = if family == "conv2d" {
        vec![a.ty(0)?]
    } else {
        vec![a.ty(0)?, a.ty(1)?]
    };
    let mut consts = vec![
        c_u64("NB", nb),
        c_u64("CI", ci),
        c_u64("H", h),
        c_u64("W", wd),
        c_u64("CO", co),
        c_u64("CIG", cig),
        c_u64("COG", cog),
        c_u64("KH", kh),
        c_u64("KW", kw),
        c_u64("HO", ho),
        c_u64("WO", wo),
    ];
    consts.extend(window_consts(c.stride, c.padding));
    consts.extend([c_u64("DH", u(c.dilation[0])), c_u64("DW", u(c.dilation[1]))]);
    if splits > 1 {
        let Launch::Grid([gx, gy, _], block) = launch else {
            return Err(a.unsupported("weight gradient launch"));
        };
        consts.extend([c_u64("SPLITK", splits), c_u64("KS", k.div_ceil(splits))]);
        let call = format!(
            "conv2d_backward_weight_split_kernel<{}, Cfg>(arena, in0, in1, out, ws, phase)",
            types.join(", ")
        );
        let elements = g * cog * cig * kh * kw;
        return Ok(two_stage(
            "conv2d_backward_weight",
            &[crate::ops::matmul::Family::TEMPLATE, TEMPLATE],
            consts,
            call,
            &[
                KernelParam::Input(0),
                KernelParam::Input(1),
                KernelParam::Output,
            ],
            ([gx, gy, g * splits], block),
            elements.div_ceil(256).min(PARTIAL_BLOCKS),
        ));
    }
    Ok(templated(
        family,
        &[crate::ops::matmul::Family::TEMPLATE, TEMPLATE],
        consts,
        (&format!("{family}_kernel"), &types, 2),
        launch,
    ))
}

impl CudaLowering for super::Family {
    /// The weight gradient's split partials (`weight_workspace`); nothing else.
    fn cuda_workspace_bytes(
        &self,
        op: &crate::ir::Op,
        inputs: &[&crate::ir::TensorType],
        out: &crate::ir::TensorType,
    ) -> u64 {
        match (op, inputs) {
            (Op::Conv2dBackwardWeight { conv: c, .. }, [x, dy, ..]) => {
                weight_workspace(&x.shape, &out.shape, &dy.shape, c.groups)
            }
            _ => 0,
        }
    }

    fn lower(&self, a: &Args) -> Result<Kernel, CodegenError> {
        let out = &a.output.shape;
        match a.op {
            Op::Conv2d(c) => {
                let (x, w) = (a.at(0)?, a.at(1)?);
                conv(a, "conv2d", c, &x.shape, &w.shape, out)
            }
            Op::Conv2dBackwardInput { conv: c, .. } => {
                let (dy, w) = (a.at(0)?, a.at(1)?);
                conv(a, "conv2d_backward_input", c, out, &w.shape, &dy.shape)
            }
            Op::Conv2dBackwardWeight { conv: c, .. } => {
                let (x, dy) = (a.at(0)?, a.at(1)?);
                conv(a, "conv2d_backward_weight", c, &x.shape, out, &dy.shape)
            }
            _ => Err(a.foreign("conv")),
        }
    }
}
