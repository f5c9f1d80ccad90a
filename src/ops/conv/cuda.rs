//! CUDA lowering of the N-d convolution, its input and weight gradients and the transposed
//! convolution onto `conv.cu`: implicit GEMMs on the tiled core of the matmul template, one
//! GEMM batch per group, over the 3-D geometry every convolution lifts to.

use super::Geom;
use crate::codegen::build::c_u64;
use crate::codegen::geometry::u;
use crate::codegen::geometry::{FILL_BLOCKS, PARTIAL_BLOCKS, SMS};
use crate::codegen::launch::{gemm_launch, gemm_tiles, templated, two_stage, Launch};
use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel, KernelParam};
use crate::ir::{Op, TensorType};
use crate::ops::cuda::CudaLowering;

/// `conv.cu`: the implicit-GEMM IO objects and entry templates (after `matmul.cu`).
const TEMPLATE: &str = include_str!("conv.cu");

/// Least K a split sums (16 of the GEMM's K steps) when it splits to fill [`FILL_BLOCKS`].
const MIN_SPLIT_K: u64 = 256;

/// Least K a split sums (4 of the GEMM's K steps) when that is what it takes to give an
/// H100's [`SMS`] a block each.
const MIN_FILL_K: u64 = 64;

/// Most bytes of fp32 partials a split GEMM keeps in its workspace.
const MAX_PARTIALS: u64 = 64 << 20;

/// The three implicit GEMMs of the family.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Which {
    /// The convolution (and nothing else): `y`.
    Forward,
    /// The input gradient, which is also the transposed convolution: `dx`.
    Input,
    /// The weight gradient: `dw`.
    Weight,
}

impl Which {
    /// The family (and entry) name.
    fn family(self) -> &'static str {
        match self {
            Which::Forward => "conv",
            Which::Input => "conv_backward_input",
            Which::Weight => "conv_backward_weight",
        }
    }

    /// The GEMM over geometry `g`: (groups, and per group the output's `m` x `n` and the
    /// summed length `k`). The forward: output channels by positions, summing input channels
    /// times taps; the input gradient: input channels by input positions, summing output
    /// channels times taps; the weight gradient: output channels by `CIG * taps`, summing
    /// positions.
    fn gemm(self, g: &Geom) -> (u64, u64, u64, u64) {
        let groups = u(g.groups.max(1));
        let taps: u64 = g.kernel.iter().map(|&k| u(k)).product();
        let out: u64 = g.out().iter().map(|&o| u(o)).product();
        let plane: u64 = g.size.iter().map(|&s| u(s)).product();
        let (cig, cog, nb) = (u(g.c_in) / groups, u(g.c_out) / groups, u(g.n));
        match self {
            Which::Forward => (groups, cog, nb * out, cig * taps),
            Which::Input => (groups, cig, nb * plane, cog * taps),
            Which::Weight => (groups, cog, cig * taps, nb * out),
        }
    }

    /// Splits of the GEMM's K over `g`: the weight gradient (a small output summed over every
    /// position) splits to fill [`FILL_BLOCKS`], each split summing at least [`MIN_SPLIT_K`];
    /// the forward and the input gradient split only when their output tiles would leave an
    /// H100's [`SMS`] partly idle, and then only as far as a block for each SM (their
    /// partials take as many bytes as their output per split, and a forward's may stand at
    /// the step's peak). Splits sum at least [`MIN_FILL_K`] where the longer ones would leave
    /// SMs idle; the partials stay within [`MAX_PARTIALS`]; 1 when nothing splits.
    fn splits(self, g: &Geom) -> u64 {
        let (groups, m, n, k) = self.gemm(g);
        let (gx, gy) = gemm_tiles(m, n);
        let tiles = gx * gy * groups;
        let busy = SMS.div_ceil(tiles.max(1)).min(k / MIN_FILL_K);
        let wanted = match self {
            Which::Weight => busy.max(FILL_BLOCKS.div_ceil(tiles.max(1)).min(k / MIN_SPLIT_K)),
            Which::Forward | Which::Input => busy,
        };
        let by_bytes = MAX_PARTIALS / (groups * m * n * 4).max(1);
        wanted.min(by_bytes).max(1)
    }

    /// The workspace: the splits' fp32 partials (0 when nothing splits).
    fn workspace(self, g: &Geom) -> u64 {
        let (groups, m, n, _) = self.gemm(g);
        match self.splits(g) {
            1 => 0,
            s => s * groups * m * n * 4,
        }
    }
}

/// The GEMM an op of the family computes and its forward geometry, from the op's input and
/// output shapes; `None` for an op of another family.
fn which_of(op: &Op, inputs: &[&[usize]], out: &[usize]) -> Option<(Which, Geom)> {
    match (op, inputs) {
        (Op::Conv(c), [x, w, ..]) => Some((Which::Forward, Geom::new(c, x, w))),
        (Op::ConvBackwardInput { conv: c, .. } | Op::ConvTranspose { conv: c, .. }, [_, w, ..]) => {
            Some((Which::Input, Geom::new(c, out, w)))
        }
        (Op::ConvBackwardWeight { conv: c, .. }, [x, ..]) => {
            Some((Which::Weight, Geom::new(c, x, out)))
        }
        _ => None,
    }
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
/// backward kernels); split over K, `{family}_split_kernel`, two stages over fp32 partials.
fn conv(a: &Args, which: Which, g: &Geom) -> Result<Kernel, CodegenError> {
    let family = which.family();
    let (groups, m, n, k) = which.gemm(g);
    let launch = gemm_launch(a, m, n, groups)?;
    let types = if which == Which::Forward {
        vec![a.ty(0)?]
    } else {
        vec![a.ty(0)?, a.ty(1)?]
    };
    let mut consts = geom_consts(g);
    let splits = which.splits(g);
    if splits == 1 {
        return Ok(templated(
            family,
            &[crate::ops::matmul::Family::TEMPLATE, TEMPLATE],
            consts,
            (&format!("{family}_kernel"), &types, 2),
            launch,
        ));
    }
    let Launch::Grid([gx, gy, _], block) = launch else {
        return Err(a.unsupported("split GEMM launch"));
    };
    consts.extend([c_u64("SPLITK", splits), c_u64("KS", k.div_ceil(splits))]);
    let call = format!(
        "{family}_split_kernel<{}, Cfg>(arena, in0, in1, out, ws, phase)",
        types.join(", ")
    );
    Ok(two_stage(
        family,
        &[crate::ops::matmul::Family::TEMPLATE, TEMPLATE],
        consts,
        call,
        &[
            KernelParam::Input(0),
            KernelParam::Input(1),
            KernelParam::Output,
        ],
        ([gx, gy, groups * splits], block),
        (groups * m * n).div_ceil(256).min(PARTIAL_BLOCKS),
    ))
}

impl CudaLowering for super::Family {
    /// A GEMM split over K keeps its splits' fp32 partials there; nothing else.
    fn cuda_workspace_bytes(&self, op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
        let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape.as_slice()).collect();
        which_of(op, &shapes, &out.shape).map_or(0, |(which, g)| which.workspace(&g))
    }

    fn lower(&self, a: &Args) -> Result<Kernel, CodegenError> {
        let shapes: Vec<&[usize]> = a.inputs.iter().map(|t| t.shape.as_slice()).collect();
        let (which, g) =
            which_of(a.op, &shapes, &a.output.shape).ok_or_else(|| a.foreign("conv"))?;
        conv(a, which, &g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{ConvParams, DType};

    /// The shim's `conv2d_split` cases: a 3x3 convolution of 32 channels on a 6x6 plane
    /// splits the forward's and the input gradient's K (288) in four, not the weight
    /// gradient's (36).
    #[test]
    fn few_tiles_over_a_long_k_split_it() {
        let conv = ConvParams {
            stride: vec![1, 1],
            padding: vec![1, 1],
            dilation: vec![1, 1],
            groups: 1,
        };
        let (x, w) = (&[1, 32, 6, 6][..], &[32, 32, 3, 3][..]);
        let splits = |op: Op, inputs: [&[usize]; 2], out: &[usize]| {
            let (which, g) = which_of(&op, &inputs, out).expect("a convolution");
            (which.splits(&g), which.workspace(&g))
        };
        let fwd = splits(Op::Conv(conv.clone()), [x, w], x);
        let input = Op::ConvBackwardInput {
            conv: conv.clone(),
            input: vec![6, 6],
        };
        let bwd_in = splits(input, [x, w], x);
        let weight = Op::ConvBackwardWeight {
            conv: conv.clone(),
            kernel: vec![3, 3],
        };
        let bwd_w = splits(weight, [x, x], w);
        assert_eq!(fwd, (4, 4 * 32 * 36 * 4));
        assert_eq!(bwd_in, (4, 4 * 32 * 36 * 4));
        assert_eq!(bwd_w, (1, 0));
        // The shim's `conv2d_bwd_w_split_k`: two groups of one output tile, K = 800 in 12
        // splits (a block for each SM, each at least 64 long) rather than 3 of 256.
        let grouped = ConvParams {
            groups: 2,
            ..conv.clone()
        };
        let weight = Op::ConvBackwardWeight {
            conv: grouped,
            kernel: vec![3, 3],
        };
        let split_k = splits(weight, [&[2, 4, 20, 20], &[2, 6, 20, 20]], &[6, 2, 3, 3]);
        assert_eq!(split_k, (12, 12 * 6 * 18 * 4));
        let t = |s: &[usize]| TensorType::new(DType::F32, s.to_vec());
        let kernel = crate::codegen::kernel_for(&Op::Conv(conv), &[t(x), t(w)], &t(x))
            .expect("lowers")
            .expect("a kernel");
        assert!(kernel.finish.is_some() && kernel.source.contains("conv_split_kernel"));
    }
}
