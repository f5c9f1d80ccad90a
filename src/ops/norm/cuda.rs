//! CUDA lowering of the normalizations onto `norm.cu`: the forward, the input gradient and
//! batch norm's running statistics, one block per statistics group, or, when the groups are
//! too few to fill an H100 and large, two stages over slices of each group (fp32 partial
//! moments per slice in the workspace, merged in slice order); the weight and bias gradients,
//! two-stage reductions over position chunks (fp32 partials per chunk and channel in the
//! workspace, summed over the chunks in order by a thread per channel).

use crate::codegen::build::{c_bool, c_f32, c_int, c_u64};
use crate::codegen::geometry::{
    numel, pow2_block, slices, slices_workspace, split, u, FILL_BLOCKS, SLICE_ELEMENTS, SMS,
};
use crate::codegen::launch::{single, sliced, two_stage, Launch};
use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel, KernelParam};
use crate::ir::infer::norm_channels;
use crate::ir::{DType, NormKind, Op, TensorType};
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
        "norm_kernel<{}, {}, {}, Cfg>(arena, in0, in1, {b}, out",
        a.ty(0)?,
        a.ty(1)?,
        a.out_ty()
    );
    let mut p = vec![KernelParam::Input(0), KernelParam::Input(1)];
    if has_bias {
        p.push(KernelParam::Input(2));
    }
    p.push(KernelParam::Output);
    Ok(grouped("norm", lines, call, &p, (groups, gsize), false))
}

/// A residual add and the norm of its sum ([`Op::AddNorm`]): the forward's geometry over the
/// sum, each block storing the sums of the rows it normalizes first.
fn add_norm(
    a: &Args,
    (kind, eps): (NormKind, f32),
    store: Option<DType>,
) -> Result<Kernel, CodegenError> {
    let x = a.at(0)?;
    let has_bias = a.inputs.len() == 4;
    let (mut lines, groups, gsize) = norm_cfg(kind, eps, &x.shape, has_bias);
    let t = store.unwrap_or(DType::F32);
    lines.push(c_u64("NORM_AT", super::add_norm_at(x.numel(), t.size()).0));
    let bias = if has_bias { "in3" } else { "in2" };
    let call = format!(
        "add_norm_kernel<{}, {}, {}, {}, Cfg>(arena, in0, in1, in2, {bias}, out",
        a.ty(0)?,
        a.ty(1)?,
        a.ty(2)?,
        crate::codegen::ctype(t),
    );
    let mut p: Vec<KernelParam> = (0..a.inputs.len()).map(KernelParam::Input).collect();
    p.push(KernelParam::Output);
    Ok(grouped("add_norm", lines, call, &p, (groups, gsize), false))
}

/// The input gradient: `in3`, when there is one, is a gradient added to it as each element
/// is stored (`passes::norm_accumulate`; `dy` stands in when there is none).
fn backward_input(a: &Args, kind: NormKind, eps: f32) -> Result<Kernel, CodegenError> {
    let x = a.at(0)?;
    let acc = a.inputs.len() == 4;
    let (mut lines, groups, gsize) = norm_cfg(kind, eps, &x.shape, false);
    lines.push(c_bool("ACC", acc));
    let (g, tg) = if acc {
        ("in3", a.ty(3)?)
    } else {
        ("in2", a.ty(2)?)
    };
    let call = format!(
        "norm_backward_input_kernel<{}, {}, {}, {tg}, Cfg>(arena, in0, in1, in2, {g}, out",
        a.ty(0)?,
        a.ty(1)?,
        a.ty(2)?,
    );
    let mut p: Vec<KernelParam> = (0..a.inputs.len()).map(KernelParam::Input).collect();
    p.push(KernelParam::Output);
    Ok(grouped(
        "norm_backward_input",
        lines,
        call,
        &p,
        (groups, gsize),
        false,
    ))
}

/// The workspace of a kernel over `groups` statistics groups of `gsize` elements: four fp32
/// partials (`norm_partial` in `norm.cu`) per slice when they are split, none otherwise.
fn slice_workspace(groups: u64, gsize: u64) -> u64 {
    slices_workspace(groups, gsize, 4 * 4)
}

/// A kernel with a block per statistics group (`geometry` = (groups, group size)), or, when
/// the groups are too few to fill an H100, a block per slice in two stages ([`sliced`]): phase 0 writes
/// each slice's partial statistics to the workspace, phase 1 merges them, over the same grid,
/// or over a thread per group when `per_group_finish`.
fn grouped(
    family: &'static str,
    lines: Vec<String>,
    call: String,
    params: &[KernelParam],
    (groups, gsize): (u64, u64),
    per_group_finish: bool,
) -> Kernel {
    let finish = |n: u64, block: u32| match per_group_finish {
        true => groups.div_ceil(u64::from(block)),
        false => groups * n,
    };
    let geometry = (groups, gsize, 512);
    sliced((family, &[TEMPLATE]), lines, call, params, geometry, finish)
}

/// Most position chunks of the weight and bias gradients: a block per chunk for layer/RMS
/// norm (twice the 132 streaming multiprocessors of an H100; each writes `CH` fp32 partials),
/// chunks times channels blocks for batch/group norm.
const PARAM_BLOCKS: u64 = 2 * 132;

/// Most channels one thread of the layer/RMS weight and bias gradients owns.
const MAX_CPT: u64 = 32;

/// The two-stage geometry of a weight or bias gradient.
struct ParamGeometry {
    /// Constants besides `norm_cfg`'s: `CPT`, `RPB`, `NPB`, `CHUNKS`.
    lines: Vec<String>,
    /// The first launch's grid and block.
    grid: [u64; 3],
    block: u32,
    /// Position chunks, channels, and channels one thread owns (layer/RMS norm).
    chunks: u64,
    ch: u64,
    cpt: u64,
    /// fp32 partials per chunk and channel.
    per_channel: u64,
}

/// The geometry of a weight (`bias` false) or bias gradient over `x`: layer/RMS norm split
/// the rows into up to [`PARAM_BLOCKS`] chunks, a block each covering every channel;
/// batch/group norm take a block per channel and sample chunk, about [`PARAM_BLOCKS`] in
/// all, or, when channels times samples are too few to fill an H100, a block per channel,
/// sample and slice of its positions ([`sample_slices`]). Each chunk keeps one fp32 partial
/// per channel, but the batch weight gradient and the sliced samples four (statistics that
/// span chunks: see `batch_weight_partial` and `sample_slices_partial` in `norm.cu`).
fn param_geometry(kind: NormKind, x: &[usize], bias: bool) -> ParamGeometry {
    let ch = u(norm_channels(kind, x));
    let (nb, s) = (
        x.first().map_or(0, |&n| u(n)),
        numel(x.get(2..).unwrap_or(&[])),
    );
    let sampled = match kind {
        NormKind::Batch | NormKind::Group(_) => sample_slices(ch, nb, s),
        NormKind::Layer | NormKind::Rms => None,
    };
    let (grid, block, (chunks, per), cpt) = match (kind, sampled) {
        (NormKind::Layer | NormKind::Rms, _) => {
            let rows = numel(x).checked_div(ch).unwrap_or(0);
            let block = pow2_block(ch.div_ceil(8), 32, 1024);
            let split = split(rows, 1, PARAM_BLOCKS);
            let cpt = ch.div_ceil(u64::from(block)).max(1);
            ([split.0, 1, 1], block, split, cpt)
        }
        (_, Some((p, len))) => ([ch, nb * p, 1], pow2_block(len, 32, 256), (nb * p, 1), 1),
        (_, None) => {
            let split = split(nb, 1, PARAM_BLOCKS.div_ceil(ch.max(1)));
            ([ch, split.0, 1], pow2_block(s, 32, 256), split, 1)
        }
    };
    let (rpb, npb) = match kind {
        NormKind::Layer | NormKind::Rms => (per, 1),
        NormKind::Batch | NormKind::Group(_) => (1, per),
    };
    let (pslices, plen) = sampled.unwrap_or((1, 1));
    ParamGeometry {
        lines: vec![
            c_u64("CPT", cpt),
            c_u64("RPB", rpb),
            c_u64("NPB", npb),
            c_u64("CHUNKS", chunks),
            c_bool("SAMPLE_SLICES", sampled.is_some()),
            c_u64("PSLICES", pslices),
            c_u64("PLEN", plen),
        ],
        grid,
        block,
        chunks,
        ch,
        cpt,
        per_channel: match sampled {
            Some(_) => 4,
            None => 1 + 3 * u64::from(kind == NormKind::Batch && !bias),
        },
    }
}

/// When a batch or group norm's channels times samples are fewer than an H100's [`SMS`],
/// the slices each sample of a channel splits into for its weight and bias gradients (count,
/// positions each): the most, up to about [`FILL_BLOCKS`] blocks in all and slices of at
/// least [`SLICE_ELEMENTS`] positions, that divide the `s` positions evenly (so that every
/// statistics group splits into equal slices). `None` when the grid fills without them or no
/// such count above one exists.
fn sample_slices(ch: u64, nb: u64, s: u64) -> Option<(u64, u64)> {
    let units = ch * nb;
    if units == 0 || units >= SMS {
        return None;
    }
    let most = FILL_BLOCKS.div_ceil(units).min(s / SLICE_ELEMENTS);
    (2..=most)
        .rev()
        .find(|p| s.is_multiple_of(*p))
        .map(|p| (p, s / p))
}

/// [`param_geometry`], or the step's unsupported error where a thread would own more than
/// [`MAX_CPT`] channels or the grid would overflow.
fn checked_param_geometry(
    a: &Args,
    kind: NormKind,
    x: &[usize],
    bias: bool,
) -> Result<ParamGeometry, CodegenError> {
    let g = param_geometry(kind, x, bias);
    if g.cpt > MAX_CPT {
        let most = MAX_CPT * 1024;
        return Err(a.unsupported(format!("{} channels exceed {most} per block", g.ch)));
    }
    if g.grid[0] > u64::from(u32::MAX >> 1) {
        return Err(a.unsupported(format!("{} channels exceed the grid", g.ch)));
    }
    Ok(g)
}

/// The weight gradient (inputs x, dy) or, when `bias`, the bias gradient (input dy): fp32
/// partials per position chunk and channel in the workspace, summed by a second launch, a
/// thread per channel (layer and RMS norms: up to [`PARAM_BLOCKS`] chunks a channel), or
/// by the last block to finish in one launch (batch and group norms, whose channels take
/// few chunks each).
fn backward_param(a: &Args, kind: NormKind, eps: f32, bias: bool) -> Result<Kernel, CodegenError> {
    let x = a.at(0)?;
    let (mut lines, _, _) = norm_cfg(kind, eps, &x.shape, false);
    let g = checked_param_geometry(a, kind, &x.shape, bias)?;
    let last_finishes = matches!(kind, NormKind::Batch | NormKind::Group(_));
    lines.extend(g.lines);
    lines.push(c_bool("BIAS", bias));
    lines.push(c_bool("LAST_FINISHES", last_finishes));
    let (family, dy) = if bias {
        ("norm_backward_bias", 0)
    } else {
        ("norm_backward_weight", 1)
    };
    let mut params: Vec<KernelParam> = (0..=dy).map(KernelParam::Input).collect();
    params.push(KernelParam::Output);
    let call = |phase: &str| -> Result<String, CodegenError> {
        Ok(format!(
            "norm_backward_param_kernel<{}, {}, {}, Cfg>(arena, in0, in{dy}, out, ws, {phase})",
            a.ty(0)?,
            a.ty(dy)?,
            a.out_ty()
        ))
    };
    if last_finishes {
        params.push(KernelParam::Workspace);
        let launch = Launch::Grid(g.grid, g.block);
        return Ok(single(
            family,
            &[TEMPLATE],
            lines,
            call("0")?,
            &params,
            launch,
        ));
    }
    Ok(two_stage(
        family,
        &[TEMPLATE],
        lines,
        call("phase")?,
        &params,
        (g.grid, g.block),
        g.ch.div_ceil(u64::from(g.block)),
    ))
}

/// The layer or RMS norm's gradients in one pass ([`Op::NormBackward`]): the weight
/// gradient's row chunks and block ([`param_geometry`]), each block storing its rows' input
/// gradients and keeping fp32 partials per channel of the weight gradient, the bias
/// gradient (`bias`) and the sum of the input gradient rounded to `sum` in the workspace,
/// then the last block to finish summing each in chunk order (one launch); with `copy`,
/// each block also stores its rows' input gradients rounded to that type after the others.
fn backward_all(
    a: &Args,
    (kind, eps): (NormKind, f32),
    bias: bool,
    (sum, copy): (Option<DType>, Option<DType>),
) -> Result<Kernel, CodegenError> {
    let x = a.at(0)?;
    let (mut lines, rows, ch) = norm_cfg(kind, eps, &x.shape, false);
    let g = checked_param_geometry(a, kind, &x.shape, false)?;
    let copy_bytes = copy.map(|t| t.size());
    let at = super::GradsLayout::new((rows, ch, x.dtype.size()), bias, sum.is_some(), copy_bytes);
    let acc = a.inputs.len() == 4;
    lines.extend(g.lines);
    lines.extend([
        c_bool("BIAS", bias),
        c_bool("SUM", sum.is_some()),
        c_bool("ACC", acc),
        c_u64("DW_AT", at.weight),
        c_u64("DB_AT", at.bias),
        c_u64("DS_AT", at.sum),
        c_bool("COPY", copy.is_some()),
        c_u64("CP_AT", at.copy),
    ]);
    let (acc_in, tg) = match acc {
        true => ("in3", a.ty(3)?),
        false => ("in2", a.ty(2)?),
    };
    let ts = crate::codegen::ctype(sum.or(copy).unwrap_or(DType::F32));
    let call = format!(
        "norm_backward_kernel<{}, {}, {}, {tg}, {ts}, Cfg>(arena, in0, in1, in2, {acc_in}, out, ws)",
        a.ty(0)?,
        a.ty(1)?,
        a.ty(2)?,
    );
    let mut params: Vec<KernelParam> = (0..a.inputs.len()).map(KernelParam::Input).collect();
    params.extend([KernelParam::Output, KernelParam::Workspace]);
    let launch = Launch::Grid(g.grid, g.block);
    Ok(single(
        "norm_backward",
        &[TEMPLATE],
        lines,
        call,
        &params,
        launch,
    ))
}

/// Whether [`Op::NormBackward`] over `rows` rows of `ch` channels fills an H100 as the input
/// gradient alone would: it takes whole rows, so it may only where [`slices`] leaves the
/// input gradient's rows whole. Then either the rows number at least [`SMS`] (and so do
/// their chunks, up to [`PARAM_BLOCKS`] of them), or the tensor is too small to need it.
pub fn merged_backward_fills(rows: u64, ch: u64) -> bool {
    slices(rows, ch).0 == 1
}

impl CudaLowering for super::Family {
    /// The weight and bias gradients keep their fp32 partials per position chunk and channel
    /// there (`chunks x channels x 4` bytes, four times that for the batch weight gradient);
    /// the forward, the input gradient and the running statistics four fp32 partials per
    /// slice when their groups are split (`codegen::geometry::slices`), none otherwise.
    fn cuda_workspace_bytes(&self, op: &Op, inputs: &[&TensorType], _: &TensorType) -> u64 {
        let sliced = |kind, x: Option<&&TensorType>| {
            x.map_or(0, |x| {
                let (_, groups, gsize) = norm_cfg(kind, 0.0, &x.shape, false);
                slice_workspace(groups, gsize)
            })
        };
        let (kind, bias) = match op {
            Op::Norm { kind, .. }
            | Op::AddNorm { kind, .. }
            | Op::NormBackwardInput { kind, .. } => return sliced(*kind, inputs.first()),
            Op::BatchNormStats { .. } => return sliced(NormKind::Batch, inputs.get(2)),
            Op::NormBackwardWeight { kind, .. } => (*kind, false),
            Op::NormBackwardBias { kind } => (*kind, true),
            Op::NormBackward {
                kind, bias, sum, ..
            } => {
                return inputs.first().map_or(0, |x| {
                    let g = param_geometry(*kind, &x.shape, false);
                    let sums = 1 + u64::from(*bias) + u64::from(sum.is_some());
                    g.chunks * g.ch * sums * 4
                })
            }
            _ => return 0,
        };
        inputs.first().map_or(0, |x| {
            let g = param_geometry(kind, &x.shape, bias);
            g.chunks * g.ch * g.per_channel * 4
        })
    }

    fn lower(&self, a: &Args) -> Result<Kernel, CodegenError> {
        match a.op {
            Op::Norm { kind, eps, .. } => forward(a, *kind, *eps),
            Op::AddNorm { kind, eps, store } => add_norm(a, (*kind, *eps), *store),
            Op::NormBackwardInput { kind, eps } => backward_input(a, *kind, *eps),
            Op::BatchNormStats { momentum } => {
                let x = a.at(2)?;
                let (mut lines, groups, gsize) = norm_cfg(NormKind::Batch, 0.0, &x.shape, false);
                lines.push(c_f32("MOMENTUM", *momentum));
                Ok(grouped(
                    "batch_norm_stats",
                    lines,
                    format!(
                        "batch_norm_stats_kernel<{}, Cfg>(arena, in0, in1, in2",
                        a.ty(2)?
                    ),
                    &[
                        KernelParam::Input(0),
                        KernelParam::Input(1),
                        KernelParam::Input(2),
                    ],
                    (groups, gsize),
                    true,
                ))
            }
            Op::NormBackwardWeight { kind, eps } => backward_param(a, *kind, *eps, false),
            Op::NormBackwardBias { kind } => backward_param(a, *kind, 0.0, true),
            Op::NormBackward {
                kind,
                eps,
                bias,
                sum,
                copy,
            } => backward_all(a, (*kind, *eps), *bias, (*sum, *copy)),
            _ => Err(a.foreign("norm")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks a kernel over `groups` groups of `gsize` elements launches first.
    fn blocks(groups: u64, gsize: u64) -> u64 {
        groups * slices(groups, gsize).0
    }

    #[test]
    fn few_large_groups_split_into_enough_slices_to_fill_an_h100() {
        // ResNet-18 batch norms at batch 32 (channels x positions) and the UNet's group norm
        // (8 samples x 16 groups, 4 channels of 64 x 64 each).
        for (groups, gsize) in [
            (64, 32 * 112 * 112),
            (128, 32 * 28 * 28),
            (128, 4 * 64 * 64),
        ] {
            assert!(blocks(groups, gsize) >= SMS, "{groups} x {gsize}");
        }
        // Just over 1 MiB of fp32 in 131 groups, and in one group.
        assert!(blocks(131, 2001) >= SMS);
        assert!(blocks(1, 262_145) >= SMS);
        // Every slice holds an element; the slices cover the group.
        for (groups, gsize) in [(1, 1025), (3, 2940), (4, 1083), (100, 5000), (7, 1 << 24)] {
            let (n, len) = slices(groups, gsize);
            assert!(n > 1 && (n - 1) * len < gsize && n * len >= gsize);
            assert_eq!(slice_workspace(groups, gsize), groups * n * 16);
        }
    }

    #[test]
    fn many_or_small_groups_stay_one_block_each_without_a_workspace() {
        // GPT-2's layer norms (8 x 1024 rows of 768), ResNet-18's widest batch norms, and a
        // small group.
        for (groups, gsize) in [(8 * 1024, 768), (512, 32 * 7 * 7), (6, 1024), (0, 0)] {
            assert_eq!(slices(groups, gsize).0, 1, "{groups} x {gsize}");
            assert_eq!(slice_workspace(groups, gsize), 0);
        }
    }

    #[test]
    fn gradients_over_few_channels_and_samples_slice_each_sample() {
        // The 3-D UNet at batch 1: 32 channels of 64^3 positions in 16 slices each.
        assert_eq!(sample_slices(32, 1, 64 * 64 * 64), Some((16, 16_384)));
        let g = param_geometry(NormKind::Group(8), &[1, 32, 64, 64, 64], false);
        assert_eq!((g.grid, g.chunks, g.per_channel), ([32, 16, 1], 16, 4));
        assert!(g.grid.iter().product::<u64>() >= SMS);
        // Enough channels times samples (ResNet-18 at batch 32), too few positions to
        // slice, or no even split: as before.
        assert_eq!(sample_slices(64, 32, 112 * 112), None);
        assert_eq!(sample_slices(3, 1, 1500), None);
        assert_eq!(sample_slices(2, 1, 10_007), None);
        let g = param_geometry(NormKind::Batch, &[32, 64, 112, 112], true);
        assert_eq!((g.grid[1], g.per_channel), (5, 1));
    }
}
