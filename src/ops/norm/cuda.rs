//! CUDA lowering of the normalizations onto `norm.cu`: the forward and the input and weight
//! backwards, one block per statistics group; the bias backward is a reduce-template sum.

use crate::codegen::build::{c_bool, c_f32, c_int, c_u64};
use crate::codegen::geometry::{numel, pow2_block, u};
use crate::codegen::launch::{single, templated, Launch};
use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel, KernelParam};
use crate::ir::infer::norm_channels;
use crate::ir::{NormKind, Op};
use crate::ops::cuda::CudaLowering;

/// `norm.cu`: the layer / RMS / batch / group norm forward and input and weight backwards.
const TEMPLATE: &str = include_str!("norm.cu");

/// Norm geometry constants; returns (lines, statistics groups, group size).
fn norm_cfg(kind: NormKind, eps: f32, x: &[usize], has_bias: bool) -> (Vec<String>, u64, u64) {
    let total = numel(x);
    let ch = u(norm_channels(kind, x));
    let (code, nb, s, ng) = match kind {
        NormKind::Layer => (0, 1, 1, 1),
        NormKind::Rms => (1, 1, 1, 1),
        NormKind::Batch => (2, u(x[0]), numel(&x[2..]), 1),
        NormKind::Group(g) => (3, u(x[0]), numel(&x[2..]), u(g)),
    };
    let cpg = ch.checked_div(ng).unwrap_or(1);
    let (groups, gsize) = match kind {
        NormKind::Layer | NormKind::Rms => (total.checked_div(ch).unwrap_or(0), ch),
        NormKind::Batch => (ch, nb * s),
        NormKind::Group(_) => (nb * ng, cpg * s),
    };
    let lines = vec![
        c_int("KIND", code),
        c_u64("GROUPS", groups),
        c_u64("GSIZE", gsize),
        c_u64("CH", ch),
        c_u64("NB", nb),
        c_u64("S", s),
        c_u64("NG", ng),
        c_u64("CPG", cpg),
        c_f32("EPS", eps),
        c_bool("HAS_BIAS", has_bias),
    ];
    (lines, groups, gsize)
}

/// The forward: `in2` is the optional bias (the weight stands in when there is none).
fn forward(a: &Args, kind: NormKind, eps: f32) -> Result<Kernel, CodegenError> {
    let x = a.at(0)?;
    let has_bias = a.inputs.len() == 3;
    let (lines, groups, gsize) = norm_cfg(kind, eps, &x.shape, has_bias);
    let b = if has_bias { "in2" } else { "in1" };
    let call = format!(
        "norm_kernel<{}, {}, Cfg>(arena, in0, in1, {b}, out)",
        a.ty(0)?,
        a.ty(1)?
    );
    let mut p = vec![KernelParam::Input(0), KernelParam::Input(1)];
    if has_bias {
        p.push(KernelParam::Input(2));
    }
    p.push(KernelParam::Output);
    let launch = Launch::PerBlock(groups, pow2_block(gsize, 32, 512));
    Ok(single("norm", &[TEMPLATE], lines, call, &p, launch))
}

/// The weight gradient: a thread per channel for layer/RMS norm, a block per channel for
/// batch/group norm.
fn backward_weight(a: &Args, kind: NormKind, eps: f32) -> Result<Kernel, CodegenError> {
    let x = a.at(0)?;
    let (lines, _, gsize) = norm_cfg(kind, eps, &x.shape, false);
    let ch = u(norm_channels(kind, &x.shape));
    let launch = match kind {
        NormKind::Layer | NormKind::Rms => {
            let block = pow2_block(ch, 32, 256);
            Launch::Grid([ch.div_ceil(u64::from(block)), 1, 1], block)
        }
        NormKind::Batch | NormKind::Group(_) => Launch::PerBlock(ch, pow2_block(gsize, 32, 256)),
    };
    Ok(templated(
        "norm_backward_weight",
        &[TEMPLATE],
        lines,
        (
            "norm_backward_weight_kernel",
            &[a.ty(0)?, a.ty(1)?, a.out_ty()],
            2,
        ),
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
        match a.op {
            Op::Norm { kind, eps } => forward(a, *kind, *eps),
            Op::NormBackwardInput { kind, eps } => {
                let x = a.at(0)?;
                let (lines, groups, gsize) = norm_cfg(*kind, *eps, &x.shape, false);
                Ok(templated(
                    "norm_backward_input",
                    &[TEMPLATE],
                    lines,
                    (
                        "norm_backward_input_kernel",
                        &[a.ty(0)?, a.ty(1)?, a.ty(2)?],
                        3,
                    ),
                    Launch::PerBlock(groups, pow2_block(gsize, 32, 512)),
                ))
            }
            Op::NormBackwardWeight { kind, eps } => backward_weight(a, *kind, *eps),
            Op::NormBackwardBias { kind } => {
                let x = a.at(0)?;
                let keep: Vec<bool> = (0..x.shape.len())
                    .map(|d| match kind {
                        NormKind::Layer | NormKind::Rms => d + 1 == x.shape.len(),
                        NormKind::Batch | NormKind::Group(_) => d == 1,
                    })
                    .collect();
                crate::ops::reduce::Family::reduce(a, "norm_backward_bias", &x.shape, &keep, false)
            }
            _ => Err(a.foreign("norm")),
        }
    }
}
