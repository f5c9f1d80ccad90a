//! Multi-head scaled dot-product attention (grouped-query, optionally causal, optionally with
//! a key mask): the forward and the q, k and v backwards. Work is split only over independent rows and every sum runs in a
//! fixed order, so results are bitwise identical from run to run.

use crate::exec::lowp::round;
use rayon::prelude::*;

use crate::ir::{AttnInput, AttnParams};
use std::ops::Range;

/// Multi-head scaled dot-product attention geometry. q: `[b, t_q, heads*head_dim]`, k and v:
/// `[b, t_k, kv_heads*head_dim]` (grouped-query: head h uses kv head `h / (heads/kv_heads)`),
/// out: `[b, t_q, heads*head_dim]`. `scale` multiplies q.k. Query i attends the keys
/// [`AttnParams::visible_keys`] gives that the key mask (if any) keeps; a query with no such
/// key outputs zeros and takes and passes no gradient.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnGeom {
    /// Batch size.
    pub b: usize,
    /// Query length.
    pub t_q: usize,
    /// Key/value length.
    pub t_k: usize,
    /// Heads, kv heads (dividing heads), mask and the factor applied to every q.k score.
    pub attn: AttnParams,
    /// Per-head feature size.
    pub head_dim: usize,
    /// The type of q, k, v: in the backward, the probabilities and the scaled score gradients
    /// are rounded to it before they multiply (as a 16-bit GEMM takes them, on CUDA and in
    /// FlashAttention alike).
    pub operand: crate::ir::DType,
}

impl AttnGeom {
    /// Runs `f(scratch, row, out_row)` on every query row (`row = batch * t_q + position`) of
    /// `out`, in parallel, each thread reusing one scratch of `scratch_len` floats (zeroed once).
    fn par_query_rows(
        &self,
        out: &mut [f32],
        scratch_len: usize,
        f: impl Fn(&mut [f32], usize, &mut [f32]) + Sync + Send,
    ) {
        let qw = self.widths().0;
        let rows = self.b * self.t_q;
        if qw == 0 || rows == 0 {
            return;
        }
        out[..rows * qw]
            .par_chunks_mut(qw)
            .enumerate()
            .for_each_init(|| vec![0.0f32; scratch_len], |s, (row, o)| f(s, row, o));
    }

    /// The keys query `i` attends.
    fn keys(&self, i: usize) -> Range<usize> {
        self.attn.visible_keys(i, self.t_q, self.t_k)
    }

    /// Row widths of q/out and of k/v.
    fn widths(&self) -> (usize, usize) {
        (
            self.attn.heads * self.head_dim,
            self.attn.kv_heads * self.head_dim,
        )
    }

    /// The kv head query head `h` reads.
    fn kv_of(&self, h: usize) -> usize {
        h / (self.attn.heads / self.attn.kv_heads.max(1)).max(1)
    }

    /// Slice of head `h` in row `row` of a tensor with row width `width`.
    fn head<'a>(&self, x: &'a [f32], row: usize, width: usize, h: usize) -> &'a [f32] {
        &x[row * width + h * self.head_dim..][..self.head_dim]
    }
}

/// The operands of an attention: q, k and v (as [`AttnGeom`] lays them out) and the key mask
/// `[b, t_k]` when there is one (key `j` of batch item `bi` is attended when nonzero).
#[derive(Debug, Clone, Copy)]
pub struct Operands<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub mask: Option<&'a [i32]>,
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    y.iter_mut().zip(x).for_each(|(y, x)| *y += alpha * x);
}

/// Everything needed to recompute one softmax row: batch, query row, query head.
struct RowCtx<'a> {
    g: &'a AttnGeom,
    k: &'a [f32],
    v: &'a [f32],
    mask: Option<&'a [i32]>,
    dout: &'a [f32],
}

impl RowCtx<'_> {
    /// The scaled score `scale q.k_j` of query row `qh` against key `j` of batch `bi`, kv head
    /// `kvh`, before any soft cap.
    fn score(&self, bi: usize, kvh: usize, qh: &[f32], j: usize) -> f32 {
        let kvw = self.g.widths().1;
        self.g.attn.scale * dot(qh, self.g.head(self.k, bi * self.g.t_k + j, kvw, kvh))
    }

    /// Writes the softmax probabilities of query row `qh` (batch `bi`, kv head `kvh`) over its
    /// visible `keys` into `p` (`keys.len()` long): 0 for masked keys, and all 0 when every
    /// key is masked.
    fn probs(&self, bi: usize, kvh: usize, qh: &[f32], keys: &Range<usize>, p: &mut [f32]) {
        let row = bi * self.g.t_k;
        for (j, pj) in keys.clone().zip(p.iter_mut()) {
            *pj = if self.mask.is_some_and(|m| m[row + j] == 0) {
                f32::NEG_INFINITY
            } else {
                self.g.attn.cap(self.score(bi, kvh, qh, j))
            };
        }
        let max = p.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
        if max == f32::NEG_INFINITY {
            p.fill(0.0);
            return;
        }
        let mut sum = 0.0f32;
        for pj in p.iter_mut() {
            *pj = (*pj - max).exp();
            sum += *pj;
        }
        let inv = 1.0 / sum;
        p.iter_mut().for_each(|pj| *pj *= inv);
    }

    /// Turns probabilities `p` of query row `qh` over `keys` into the gradients of the scaled
    /// scores `ds_j = p_j (dout.v_j - sum_l p_l dout.v_l)`, times the soft cap's slope, in
    /// place, using `dp` as scratch of the same length.
    #[allow(clippy::too_many_arguments)]
    fn score_grads(
        &self,
        bi: usize,
        kvh: usize,
        qh: &[f32],
        dout_h: &[f32],
        keys: &Range<usize>,
        p: &mut [f32],
        dp: &mut [f32],
    ) {
        let (_, kvw) = self.g.widths();
        for (j, dpj) in keys.clone().zip(dp.iter_mut()) {
            *dpj = dot(dout_h, self.g.head(self.v, bi * self.g.t_k + j, kvw, kvh));
        }
        let d: f32 = p.iter().zip(dp.iter()).map(|(a, b)| a * b).sum();
        p.iter_mut()
            .zip(dp.iter())
            .for_each(|(pj, dpj)| *pj *= dpj - d);
        if self.g.attn.softcap.is_some() {
            for (j, pj) in keys.clone().zip(p.iter_mut()) {
                *pj *= self.g.attn.cap_slope(self.score(bi, kvh, qh, j));
            }
        }
    }
}

/// Scaled dot-product attention forward: `out_i = sum_j softmax_j(cap(scale q_i.k_j)) v_j` per
/// head, over the visible keys (`cap` is [`AttnParams::cap`]). Computed one query row at a time (one row of scores per thread, no
/// `t x t` matrix); `out` is fully overwritten.
pub fn attention_forward(g: &AttnGeom, x: Operands, out: &mut [f32]) {
    let (qw, kvw) = g.widths();
    let Operands { q, k, v, mask } = x;
    let ctx = RowCtx {
        g,
        k,
        v,
        mask,
        dout: &[],
    };
    g.par_query_rows(out, g.t_k, |p, row, o| {
        let (bi, i) = (row / g.t_q, row % g.t_q);
        let keys = g.keys(i);
        let p = &mut p[..keys.len()];
        for h in 0..g.attn.heads {
            let kvh = g.kv_of(h);
            ctx.probs(bi, kvh, g.head(q, row, qw, h), &keys, p);
            let oh = &mut o[h * g.head_dim..(h + 1) * g.head_dim];
            oh.fill(0.0);
            for (j, &pj) in keys.clone().zip(p.iter()) {
                axpy(pj, g.head(v, bi * g.t_k + j, kvw, kvh), oh);
            }
        }
    });
}

/// Gradient of `sum(out * dout)` w.r.t. the chosen input, written over `dst` (shape of that
/// input). Softmax rows are recomputed from q and k (no saved `t x t` state). For K and V with
/// grouped heads the query heads sharing a kv head are summed in head order. Deterministic:
/// dQ is parallel over query rows, dK/dV over (batch, kv head) pairs, each summed in a fixed
/// order.
pub fn attention_backward(
    g: &AttnGeom,
    x: Operands,
    dout: &[f32],
    which: AttnInput,
    dst: &mut [f32],
) {
    let (qw, kvw) = g.widths();
    let Operands { q, k, v, mask } = x;
    let ctx = RowCtx {
        g,
        k,
        v,
        mask,
        dout,
    };
    match which {
        AttnInput::Q => attention_backward_q(&ctx, q, dst),
        AttnInput::K | AttnInput::V => {
            let dst = &mut dst[..g.b * g.t_k * kvw];
            dst.fill(0.0);
            if qw == 0 || g.t_q == 0 {
                return;
            }
            let out = SharedOut {
                ptr: dst.as_mut_ptr(),
                len: dst.len(),
            };
            let group = g.attn.heads / g.attn.kv_heads.max(1);
            (0..g.b * g.attn.kv_heads).into_par_iter().for_each_init(
                || vec![0.0f32; 2 * g.t_k],
                |scratch, task| {
                    let (bi, kvh) = (task / g.attn.kv_heads, task % g.attn.kv_heads);
                    let (p, dp) = scratch.split_at_mut(g.t_k);
                    for h in kvh * group..(kvh + 1) * group {
                        for i in 0..g.t_q {
                            let row = bi * g.t_q + i;
                            let (qh, doh) = (g.head(q, row, qw, h), g.head(dout, row, qw, h));
                            let keys = g.keys(i);
                            let p = &mut p[..keys.len()];
                            ctx.probs(bi, kvh, qh, &keys, p);
                            let (src, alpha) = if which == AttnInput::K {
                                ctx.score_grads(bi, kvh, qh, doh, &keys, p, &mut dp[..keys.len()]);
                                (qh, g.attn.scale)
                            } else {
                                (doh, 1.0)
                            };
                            for (j, &pj) in keys.clone().zip(p.iter()) {
                                let off = (bi * g.t_k + j) * kvw + kvh * g.head_dim;
                                // SAFETY: task (bi, kvh) is the only one touching the
                                // head_dim-long segments at batch bi, kv head kvh, and this
                                // slice is dropped before the next is made.
                                let seg = unsafe { out.segment(off, g.head_dim) };
                                axpy(round(g.operand, alpha * pj), src, seg);
                            }
                        }
                    }
                },
            );
        }
    }
}

/// dQ: `dq_i = scale * sum_j ds_ij k_j`, parallel over query rows.
fn attention_backward_q(ctx: &RowCtx, q: &[f32], dst: &mut [f32]) {
    let g = ctx.g;
    let (qw, kvw) = g.widths();
    g.par_query_rows(dst, 2 * g.t_k, |scratch, row, d| {
        let (bi, i) = (row / g.t_q, row % g.t_q);
        let keys = g.keys(i);
        let (p, dp) = scratch.split_at_mut(g.t_k);
        let (p, dp) = (&mut p[..keys.len()], &mut dp[..keys.len()]);
        for h in 0..g.attn.heads {
            let kvh = g.kv_of(h);
            let qh = g.head(q, row, qw, h);
            ctx.probs(bi, kvh, qh, &keys, p);
            ctx.score_grads(bi, kvh, qh, g.head(ctx.dout, row, qw, h), &keys, p, dp);
            let dh = &mut d[h * g.head_dim..(h + 1) * g.head_dim];
            dh.fill(0.0);
            for (j, &ds) in keys.clone().zip(p.iter()) {
                axpy(
                    round(g.operand, g.attn.scale * ds),
                    g.head(ctx.k, bi * g.t_k + j, kvw, kvh),
                    dh,
                );
            }
        }
    });
}

/// A raw view of an exclusively borrowed output that parallel tasks write in disjoint segments.
struct SharedOut {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: the pointer comes from a `&mut [f32]` that outlives every task; tasks only create
// non-overlapping segments (see `segment`).
unsafe impl Sync for SharedOut {}
unsafe impl Send for SharedOut {}

impl SharedOut {
    /// Mutable segment `[off, off + len)` of the output.
    ///
    /// # Safety
    /// No other live reference may overlap the segment.
    #[allow(clippy::mut_from_ref)]
    unsafe fn segment(&self, off: usize, len: usize) -> &mut [f32] {
        assert!(off + len <= self.len, "segment out of bounds");
        std::slice::from_raw_parts_mut(self.ptr.add(off), len)
    }
}

#[cfg(test)]
mod tests;
