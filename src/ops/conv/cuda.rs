//! CUDA lowering of the N-d convolution, its input and weight gradients and the transposed
//! convolution onto `conv.cu`: implicit GEMMs on the tiled core of the matmul template, one
//! GEMM batch per group, over the 3-D geometry every convolution lifts to.

use super::Geom;
use crate::codegen::build::c_u64;
use crate::codegen::geometry::u;
use crate::codegen::geometry::{FILL_BLOCKS, PARTIAL_BLOCKS};
use crate::codegen::launch::{gemm_launch, gemm_tiles, templated, two_stage, Launch};
use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel, KernelParam};
use crate::ir::{Op, TensorType};
use crate::ops::cuda::CudaLowering;

/// `conv.cu`: the implicit-GEMM IO objects and entry templates (after `matmul.cu`).
const TEMPLATE: &str = include_str!("conv.cu");

/// Least K a split of the weight gradient sums (16 of the GEMM's K steps).
const MIN_SPLIT_K: u64 = 256;

/// Most bytes of fp32 partials the split weight gradient keeps in its workspace.
const MAX_PARTIALS: u64 = 64 << 20;

/// Splits of the weight gradient's K (`nb * prod(output)`) for `tiles` output tiles of a
/// `cog x nw` gradient per group over `g` groups: enough for [`FILL_BLOCKS`], each at least
/// [`MIN_SPLIT_K`] long, the partials within [`MAX_PARTIALS`]; 1 when no split is needed.
fn weight_splits(k: u64, tiles: u64, (g, cog, nw): (u64, u64, u64)) -> u64 {
    let by_fill = FILL_BLOCKS.div_ceil(tiles.max(1));
    let by_k = k / MIN_SPLIT_K;
    let by_bytes = MAX_PARTIALS / (g * cog * nw * 4).max(1);
    by_fill.min(by_k).min(by_bytes).max(1)
}

/// The weight gradient's workspace: its splits' fp32 partials (0 when it does not split).
fn weight_workspace(g: &Geom) -> u64 {
    let (groups, cog, nw, k) = gemm_dims(g);
    let (gx, gy) = gemm_tiles(cog, nw);
    match weight_splits(k, gx * gy * groups, (groups, cog, nw)) {
        1 => 0,
        s => s * groups * cog * nw * 4,
    }
}

/// The weight gradient's GEMM: (groups, output channels per group, weights per output
/// channel `CIG * prod(kernel)`, summed length `NB * prod(output)`).
fn gemm_dims(g: &Geom) -> (u64, u64, u64, u64) {
    let groups = u(g.groups.max(1));
    let taps: u64 = g.kernel.iter().map(|&k| u(k)).product();
    let out: u64 = g.out().iter().map(|&o| u(o)).product();
    (
        groups,
        u(g.c_out) / groups,
        u(g.c_in) / groups * taps,
        u(g.n) * out,
    )
}

/// The kernel's constants for geometry `g`: shapes, and per spatial axis (D, H, W) the
/// extents, kernel, output, stride, padding and dilation.
fn geom_consts(g: &Geom) -> Vec<String> {
    let groups = u(g.groups.max(1));
    let mut consts = vec![
        c_u64("NB", u(g.n)),
        c_u64("CI", u(g.c_in)),
        c_u64("CO", u(g.c_out)),
        c_u64("CIG", u(g.c_in) / groups),
        c_u64("COG", u(g.c_out) / groups),
    ];
    let out = g.out();
    for (d, axis) in ["D", "H", "W"].into_iter().enumerate() {
        consts.extend([
            c_u64(axis, u(g.size[d])),
            c_u64(&format!("K{axis}"), u(g.kernel[d])),
            c_u64(&format!("{axis}O"), u(out[d])),
            c_u64(&format!("S{axis}"), u(g.stride[d])),
            c_u64(&format!("P{axis}"), u(g.padding[d])),
            c_u64(&format!("D{axis}"), u(g.dilation[d])),
        ]);
    }
    consts
}

/// A convolution-family implicit GEMM over the forward geometry `g`. The entry is
/// `{family}_kernel`, templated on the first input's type (and the second's for the
/// backward kernels).
fn conv(a: &Args, family: &'static str, g: &Geom) -> Result<Kernel, CodegenError> {
    let (groups, cog, nw, k) = gemm_dims(g);
    let cig = u(g.c_in) / groups;
    let plane: u64 = g.size.iter().map(|&s| u(s)).product();
    let (m, n) = match family {
        "conv" => (cog, k),
        "conv_backward_input" => (cig, u(g.n) * plane),
        _ => (cog, nw),
    };
    let launch = gemm_launch(a, m, n, groups)?;
    let splits = match (family, &launch) {
        ("conv_backward_weight", Launch::Grid([gx, gy, gz], _)) => {
            weight_splits(k, gx * gy * gz, (groups, cog, nw))
        }
        _ => 1,
    };
    let types = if family == "conv" {
        vec![a.ty(0)?]
    } else {
        vec![a.ty(0)?, a.ty(1)?]
    };
    let mut consts = geom_consts(g);
    if splits > 1 {
        let Launch::Grid([gx, gy, _], block) = launch else {
            return Err(a.unsupported("weight gradient launch"));
        };
        consts.extend([c_u64("SPLITK", splits), c_u64("KS", k.div_ceil(splits))]);
        let call = format!(
            "conv_backward_weight_split_kernel<{}, Cfg>(arena, in0, in1, out, ws, phase)",
            types.join(", ")
        );
        let elements = groups * cog * nw;
        return Ok(two_stage(
            "conv_backward_weight",
            &[crate::ops::matmul::Family::TEMPLATE, TEMPLATE],
            consts,
            call,
            &[
                KernelParam::Input(0),
                KernelParam::Input(1),
                KernelParam::Output,
            ],
            ([gx, gy, groups * splits], block),
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
    fn cuda_workspace_bytes(&self, op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
        match (op, inputs) {
            (Op::ConvBackwardWeight { conv: c, .. }, [x, ..]) => {
                weight_workspace(&Geom::new(c, &x.shape, &out.shape))
            }
            _ => 0,
        }
    }

    fn lower(&self, a: &Args) -> Result<Kernel, CodegenError> {
        let out = &a.output.shape;
        match a.op {
            Op::Conv(c) => conv(a, "conv", &Geom::new(c, &a.at(0)?.shape, &a.at(1)?.shape)),
            Op::ConvBackwardInput { conv: c, .. } | Op::ConvTranspose { conv: c, .. } => conv(
                a,
                "conv_backward_input",
                &Geom::new(c, out, &a.at(1)?.shape),
            ),
            Op::ConvBackwardWeight { conv: c, .. } => conv(
                a,
                "conv_backward_weight",
                &Geom::new(c, &a.at(0)?.shape, out),
            ),
            _ => Err(a.foreign("conv")),
        }
    }
}
