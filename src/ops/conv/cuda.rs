//! CUDA lowering of the 2-D convolution and its input and weight gradients onto `conv.cu`:
//! implicit GEMMs on the tiled core of the matmul template, one GEMM batch per group.

use crate::codegen::build::c_u64;
use crate::codegen::geometry::{u, window_consts};
use crate::codegen::launch::{gemm_launch, templated};
use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel};
use crate::ir::{ConvParams, Op};
use crate::ops::cuda::CudaLowering;

/// `conv.cu`: the implicit-GEMM IO objects and entry templates (after `matmul.cu`).
const TEMPLATE: &str = include_str!("conv.cu");

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
    Ok(templated(
        family,
        &[crate::ops::matmul::Family::TEMPLATE, TEMPLATE],
        consts,
        (&format!("{family}_kernel"), &types, 2),
        launch,
    ))
}

impl CudaLowering for super::Family {
    /// No kernel of this family reads a workspace.
    fn cuda_workspace_bytes(
        &self,
        _: &crate::ir::Op,
        _: &[&crate::ir::TensorType],
        _: &crate::ir::TensorType,
    ) -> u64 {
        0
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
