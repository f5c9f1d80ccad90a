//! CUDA lowering of the fused linear cross-entropy: cuBLASLt GEMMs over chunks of the logits
//! alternating with the elementwise stages of `linear_ce.cu`. Forward and input gradient walk
//! chunks of `lce.chunk` rows (`z = x_c @ W`, then the rows' losses, or their logits'
//! gradient `p` and `dx_c = p @ W^T`); the weight gradient walks tiles of columns so that
//! each tile of `dW` is one GEMM over all rows (`dW[:, tile] = x^T @ p`), summed in fp32
//! inside cuBLASLt and rounded once. A merged backward ([`LceGrad::Both`]) walks the weight
//! gradient's tiles and also sums `dx += p @ W[:, tile]^T` over them in fp32, rounded once
//! at the end: the logits are computed once for both gradients. The logits are in the
//! operands' type, as the GEMM of a matmul in that type rounds them. Workspace: the logits of
//! a chunk (their gradient `p` written over them, a block a row, or, where those rows are
//! fewer than an H100's SMs, after the other regions, a thread an element), then each row's
//! log-sum-exp (the forward: its partials), then (merged) the fp32 `dx`, then cuBLASLt's
//! scratch.

use crate::codegen::build::{c_bool, c_u64};
use crate::codegen::gemm::{Addr, Call, Gemm, RowMajor};
use crate::codegen::geometry::{padded_row, region, u, FILL_BLOCKS, SMS};
use crate::codegen::launch::staged;
use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel};
use crate::ir::{DType, LceGrad, LinearCe, TensorType};
use crate::ops::matmul::GEMM_WORKSPACE;

/// `linear_ce.cu`: the fused linear cross-entropy's elementwise stages.
const TEMPLATE: &str = include_str!("linear_ce.cu");

/// Threads of a row block, and of the tile and log-sum-exp launches.
const BLOCK: u32 = 256;

/// The shapes of one linear cross-entropy: rows `n`, hidden `d`, classes `v`, rows per chunk,
/// columns per weight-gradient tile (as many logits as a chunk holds), operand element type,
/// and the padded row strides of a chunk's and of a tile's logits.
struct Shape {
    n: u64,
    d: u64,
    v: u64,
    chunk: u64,
    tile: u64,
    dtype: DType,
    v_ld: u64,
    tile_ld: u64,
    /// Column slices of the forward's per-row log-sum-exp: one (a single stage, a block a
    /// row) once a chunk's rows are at least an H100's SMs.
    splits: u64,
    /// Whether a backward writes the logits' gradient apart from them (elementwise, over
    /// the whole GPU) rather than over them (a block a row): when its chunk (input gradient)
    /// or its rows (weight gradient) are fewer than an H100's SMs.
    apart: bool,
}

impl Shape {
    /// The shapes of `which` (forward when `None`). A merged backward's tiles are narrower,
    /// so that its fp32 input gradient takes the bytes of the logits it leaves (the
    /// workspace of the weight gradient alone), unless that would halve them.
    fn of(lce: &LinearCe, inputs: &[&TensorType], which: Option<LceGrad>) -> Option<Shape> {
        let (n, d, v) = super::rules::linear_ce(lce, inputs).ok()?;
        let dtype = inputs.first()?.dtype;
        let chunk = u(lce.chunk).clamp(1, n.max(1));
        let mut tile = (chunk * v / n.max(1)).clamp(1, v.max(1));
        if which == Some(LceGrad::Both) {
            let fp32_row = padded_row(d) * 4 / dtype.size();
            let narrower = padded_row(tile).saturating_sub(fp32_row);
            tile = narrower.max(tile / 2).clamp(1, v.max(1));
        }
        Some(Shape {
            n,
            d,
            v,
            chunk,
            tile,
            dtype,
            v_ld: padded_row(v),
            tile_ld: padded_row(tile),
            splits: if chunk >= SMS {
                1
            } else {
                FILL_BLOCKS.div_ceil(chunk).clamp(1, (v / 1024).max(1))
            },
            apart: match which {
                None => false,
                Some(LceGrad::Input) => chunk < SMS,
                Some(LceGrad::Weight | LceGrad::Both) => n < SMS,
            },
        })
    }

    /// Byte offsets (the logits at 0) of the log-sum-exps (the forward: its rows'
    /// partials), of the fp32 input gradient a merged backward sums over the tiles, of the
    /// logits' gradient `p` (0, over the logits, unless `apart`), and where cuBLASLt's
    /// scratch begins.
    fn regions(&self, which: Option<LceGrad>) -> [u64; 4] {
        let rows = match which {
            Some(LceGrad::Both) => 0,
            _ => self.chunk * self.v_ld,
        };
        let logits = rows.max(self.n * self.tile_ld);
        let lse = region(logits * self.dtype.size());
        let acc = lse + region(self.n * 4);
        let (acc, p) = match which {
            None => {
                let scratch = lse + region(self.chunk * self.splits * 8);
                return [lse, scratch, 0, scratch];
            }
            Some(LceGrad::Input | LceGrad::Weight) => (acc, acc),
            Some(LceGrad::Both) => (acc, acc + region(self.n * self.d * 4)),
        };
        match self.apart {
            true => [lse, acc, p, p + region(logits * self.dtype.size())],
            false => [lse, acc, 0, p],
        }
    }

    /// Blocks of a stage turning `rows` rows of `width` logits into their gradient: a block
    /// a row in place, or a thread an element apart.
    fn grad_blocks(&self, rows: u64, width: u64) -> u64 {
        match self.apart {
            true => (rows * width).div_ceil(u64::from(BLOCK)),
            false => rows,
        }
    }

    /// `W` (or `E`) from column `v0` on as the right operand of `x @ W`, row-major: its
    /// address, row stride and whether it is read transposed.
    fn weight_cols(&self, tr: bool, v0: u64) -> (Addr, u64, bool) {
        let e = self.dtype.size();
        if tr {
            (Addr::Input(1, v0 * self.d * e), self.d, true)
        } else {
            (Addr::Input(1, v0 * e), self.v, false)
        }
    }
}

/// [`Gemm::row_major`] as a call.
fn gemm(x: RowMajor, y: RowMajor, out: (Addr, DType, u64), mnk: (u64, u64, u64)) -> Call {
    Call::gemm(Gemm::row_major(x, y, out, mnk))
}

/// The kernel and calls of a linear cross-entropy op (`which`: forward when `None`).
pub(crate) fn linear_ce(
    a: &Args,
    lce: &LinearCe,
    which: Option<LceGrad>,
) -> Result<Kernel, CodegenError> {
    let refs: Vec<&TensorType> = a.inputs.iter().collect();
    let s = Shape::of(lce, &refs, which).ok_or_else(|| a.err("linear cross-entropy shapes"))?;
    let [lse_at, acc_at, p_at, scratch] = s.regions(which);
    // Where a merged backward's weight gradient starts in its output, in elements.
    let w_at = crate::ops::packed_pair(s.n * s.d, s.v * s.d, s.dtype.size()).0;
    let t = s.dtype;
    let mut lines = vec![
        c_u64("N", s.n),
        c_u64("D", s.d),
        c_u64("V", s.v),
        c_bool("TR", lce.transposed),
        c_u64("CHUNK", s.chunk),
        c_u64("VT", s.tile),
        c_u64("VLD", s.v_ld),
        c_u64("VTLD", s.tile_ld),
        c_u64("SPLITS", s.splits),
        c_u64("LOFF", lse_at),
        c_u64("AOFF", acc_at),
        c_bool("APART", s.apart),
        c_u64("POFF", p_at),
        c_u64("WAT", w_at),
    ];
    lines.extend(super::cuda::ce_lines(&lce.ce));
    let (entry, n_in) = match which {
        None => ("lce_forward_kernel", 3),
        Some(LceGrad::Input) => ("lce_backward_input_kernel", 5),
        Some(LceGrad::Weight | LceGrad::Both) => ("lce_backward_weight_kernel", 5),
    };
    let kernel = staged(
        "linear_ce",
        &[super::cuda::TEMPLATE, TEMPLATE],
        lines,
        (entry, a.ty(0)?, n_in),
        BLOCK,
    );
    let e = t.size();
    let x_rows = |r0: u64| (Addr::Input(0, r0 * s.d * e), t, false, s.d);
    let z = (Addr::Workspace(0), t);
    let warps_per_block = u64::from(BLOCK / 32);
    let p = Addr::Workspace(p_at);
    let mut calls = Vec::new();
    match which {
        None | Some(LceGrad::Input) => {
            if which.is_some() {
                calls.push(Call::launch(s.n.div_ceil(warps_per_block), 0, 0));
            }
            for c in 0..s.n.div_ceil(s.chunk) {
                let r0 = c * s.chunk;
                let rn = s.chunk.min(s.n - r0);
                let (w, w_stride, w_t) = s.weight_cols(lce.transposed, 0);
                calls.push(gemm(
                    x_rows(r0),
                    (w, t, w_t, w_stride),
                    (z.0, z.1, s.v_ld),
                    (rn, s.v, s.d),
                ));
                if which.is_none() {
                    calls.push(Call::launch(rn * s.splits, 0, c));
                    if s.splits > 1 {
                        calls.push(Call::finish(rn.div_ceil(warps_per_block), 1, c));
                    }
                } else {
                    calls.push(Call::launch(s.grad_blocks(rn, s.v), 1, c));
                    // dx_c = p @ W^T: W [D, V] read transposed, or E [V, D] as stored.
                    let w_stride = if lce.transposed { s.d } else { s.v };
                    let w = Addr::Input(1, 0);
                    calls.push(gemm(
                        (p, t, false, s.v_ld),
                        (w, t, !lce.transposed, w_stride),
                        (Addr::Output(r0 * s.d * e), t, s.d),
                        (rn, s.d, s.v),
                    ));
                }
            }
        }
        Some(grad @ (LceGrad::Weight | LceGrad::Both)) => {
            let both = grad == LceGrad::Both;
            // A merged backward writes the weight's gradient after the hidden states'.
            let dw_at = if both { w_at * e } else { 0 };
            calls.push(Call::launch(s.n.div_ceil(warps_per_block), 0, 0));
            for tile in 0..s.v.div_ceil(s.tile) {
                let v0 = tile * s.tile;
                let width = s.tile.min(s.v - v0);
                let (w, w_stride, w_t) = s.weight_cols(lce.transposed, v0);
                calls.push(gemm(
                    x_rows(0),
                    (w, t, w_t, w_stride),
                    (z.0, z.1, s.tile_ld),
                    (s.n, width, s.d),
                ));
                calls.push(Call::launch(s.grad_blocks(s.n, width), 1, tile));
                let call = if lce.transposed {
                    // dE[v0.., :] = p^T @ x
                    gemm(
                        (p, t, true, s.tile_ld),
                        (Addr::Input(0, 0), t, false, s.d),
                        (Addr::Output(dw_at + v0 * s.d * e), t, s.d),
                        (width, s.d, s.n),
                    )
                } else {
                    // dW[:, v0..] = x^T @ p
                    gemm(
                        (Addr::Input(0, 0), t, true, s.d),
                        (p, t, false, s.tile_ld),
                        (Addr::Output(dw_at + v0 * e), t, s.v),
                        (s.d, width, s.n),
                    )
                };
                calls.push(call);
                if both {
                    // dx += p @ W[:, tile]^T, summed over the tiles in fp32.
                    let beta = if tile == 0 { 0.0 } else { 1.0 };
                    let product = Gemm::row_major(
                        (p, t, false, s.tile_ld),
                        (w, t, !w_t, w_stride),
                        (Addr::Workspace(acc_at), DType::F32, s.d),
                        (s.n, s.d, width),
                    );
                    calls.push(Call::gemm(product.scaled(1.0, beta)));
                }
            }
            if both {
                calls.push(Call::launch(w_at.div_ceil(u64::from(BLOCK)), 2, 0));
            }
        }
    }
    Ok(kernel.with_library(calls, scratch))
}

/// Workspace bytes of a linear cross-entropy op on CUDA: its regions and cuBLASLt's scratch.
pub(crate) fn workspace_bytes(
    lce: &LinearCe,
    which: Option<LceGrad>,
    inputs: &[&TensorType],
) -> u64 {
    Shape::of(lce, inputs, which).map_or(0, |s| s.regions(which)[3] + GEMM_WORKSPACE)
}
