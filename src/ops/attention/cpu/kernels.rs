//! Multi-head scaled dot-product attention (grouped-query, optionally causal): the forward and
//! the q, k and v backwards. Work is split only over independent rows and every sum runs in a
//! fixed order, so results are bitwise identical from run to run.

use crate::exec::lowp::round;
use rayon::prelude::*;

use crate::ir::{AttnInput, AttnParams};
use std::ops::Range;

/// Multi-head scaled dot-product attention geometry. q: `[b, t_q, heads*head_dim]`, k and v:
/// `[b, t_k, kv_heads*head_dim]` (grouped-query: head h uses kv head `h / (heads/kv_heads)`),
/// out: `[b, t_q, heads*head_dim]`. `scale` multiplies q.k. Query i attends the keys
/// [`AttnParams::visible_keys`] gives; a query with no visible key outputs zeros.
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
    dout: &'a [f32],
}

impl RowCtx<'_> {
    /// Writes the softmax probabilities of query row `qh` (batch `bi`, kv head `kvh`) over its
    /// visible `keys` into `p` (`keys.len()` long).
    fn probs(&self, bi: usize, kvh: usize, qh: &[f32], keys: &Range<usize>, p: &mut [f32]) {
        let (_, kvw) = self.g.widths();
        for (j, pj) in keys.clone().zip(p.iter_mut()) {
            *pj = self.g.attn.scale * dot(qh, self.g.head(self.k, bi * self.g.t_k + j, kvw, kvh));
        }
        let max = p.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
        let mut sum = 0.0f32;
        for pj in p.iter_mut() {
            *pj = (*pj - max).exp();
            sum += *pj;
        }
        let inv = 1.0 / sum;
        p.iter_mut().for_each(|pj| *pj *= inv);
    }

    /// Turns probabilities `p` over `keys` into score gradients
    /// `ds_j = p_j (dout.v_j - sum_l p_l dout.v_l)` in place, using `dp` as scratch of the same
    /// length.
    fn score_grads(
        &self,
        bi: usize,
        kvh: usize,
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
    }
}

/// Scaled dot-product attention forward: `out_i = sum_j softmax_j(scale q_i.k_j) v_j` per head,
/// over the visible keys. Computed one query row at a time (one row of scores per thread, no
/// `t x t` matrix); `out` is fully overwritten.
pub fn attention_forward(g: &AttnGeom, q: &[f32], k: &[f32], v: &[f32], out: &mut [f32]) {
    let (qw, kvw) = g.widths();
    let ctx = RowCtx { g, k, v, dout: &[] };
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
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dout: &[f32],
    which: AttnInput,
    dst: &mut [f32],
) {
    let (qw, kvw) = g.widths();
    let ctx = RowCtx { g, k, v, dout };
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
                                ctx.score_grads(bi, kvh, doh, &keys, p, &mut dp[..keys.len()]);
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
            ctx.probs(bi, kvh, g.head(q, row, qw, h), &keys, p);
            ctx.score_grads(bi, kvh, g.head(ctx.dout, row, qw, h), &keys, p, dp);
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
mod tests {
    //! Forward kernels are checked against naive references; backward kernels against central
    //! finite differences of `sum(forward(x) * r)` (f64 loss accumulation, eps 1e-2), with
    //! relative L2 error below 1e-2.
    use super::*;
    use crate::exec::kernels::testing::{assert_close, central_diff, dot, Rng};

    fn naive_attention(g: &AttnGeom, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f32> {
        let (qw, kvw, hd) = (
            g.attn.heads * g.head_dim,
            g.attn.kv_heads * g.head_dim,
            g.head_dim,
        );
        let mut out = vec![0.0; g.b * g.t_q * qw];
        for b in 0..g.b {
            for h in 0..g.attn.heads {
                let kvh = h / (g.attn.heads / g.attn.kv_heads);
                // The full t_q x t_k score matrix.
                let s: Vec<Vec<f64>> = (0..g.t_q)
                    .map(|i| {
                        (0..g.t_k)
                            .map(|j| {
                                // Hugging Face's mask: a later key, or one `window` or more
                                // positions back, with queries aligned to the last keys.
                                let at = i as isize + g.t_k as isize - g.t_q as isize;
                                let back = at - j as isize;
                                let far = g.attn.window.is_some_and(|w| back >= w as isize);
                                if g.attn.causal && (back < 0 || far) {
                                    return f64::NEG_INFINITY;
                                }
                                let qo = (b * g.t_q + i) * qw + h * hd;
                                let ko = (b * g.t_k + j) * kvw + kvh * hd;
                                (0..hd)
                                    .map(|d| q[qo + d] as f64 * k[ko + d] as f64)
                                    .sum::<f64>()
                                    * g.attn.scale as f64
                            })
                            .collect()
                    })
                    .collect();
                for (i, row) in s.iter().enumerate() {
                    let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = row.iter().map(|x| (x - max).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for d in 0..hd {
                        let acc: f64 = (0..g.t_k)
                            .map(|j| e[j] / z * v[(b * g.t_k + j) * kvw + kvh * hd + d] as f64)
                            .sum();
                        out[(b * g.t_q + i) * qw + h * hd + d] = acc as f32;
                    }
                }
            }
        }
        out
    }

    fn attn_geoms() -> Vec<AttnGeom> {
        let attn = AttnParams {
            heads: 4,
            kv_heads: 2,
            causal: false,
            scale: 0.7,
            window: None,
        };
        let causal = AttnParams {
            causal: true,
            ..attn
        };
        let base = AttnGeom {
            b: 2,
            t_q: 5,
            t_k: 5,
            attn,
            head_dim: 3,
            operand: crate::ir::DType::F32,
        };
        vec![
            base,
            AttnGeom {
                attn: causal,
                ..base
            },
            AttnGeom {
                attn: causal,
                t_q: 3,
                t_k: 6,
                ..base
            },
            AttnGeom {
                attn: AttnParams {
                    kv_heads: 4,
                    ..attn
                },
                t_q: 4,
                t_k: 6,
                ..base
            },
            // Sliding windows shorter than the sequence, with grouped and with fewer queries
            // than keys.
            AttnGeom {
                attn: AttnParams {
                    window: Some(2),
                    ..causal
                },
                t_q: 7,
                t_k: 7,
                ..base
            },
            AttnGeom {
                attn: AttnParams {
                    window: Some(3),
                    ..causal
                },
                t_q: 4,
                t_k: 7,
                ..base
            },
            AttnGeom {
                attn: AttnParams {
                    window: Some(1),
                    ..causal
                },
                ..base
            },
        ]
    }

    fn attn_inputs(g: &AttnGeom, rng: &mut Rng) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let (qw, kvw) = (g.attn.heads * g.head_dim, g.attn.kv_heads * g.head_dim);
        (
            rng.vec(g.b * g.t_q * qw),
            rng.vec(g.b * g.t_k * kvw),
            rng.vec(g.b * g.t_k * kvw),
        )
    }

    fn attn_fwd(g: &AttnGeom, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f32> {
        let mut out = vec![f32::NAN; q.len()];
        attention_forward(g, q, k, v, &mut out);
        out
    }

    #[test]
    fn attention_forward_matches_naive() {
        let mut rng = Rng(3);
        for g in attn_geoms() {
            let (q, k, v) = attn_inputs(&g, &mut rng);
            assert_close(
                &attn_fwd(&g, &q, &k, &v),
                &naive_attention(&g, &q, &k, &v),
                1e-5,
                &format!("{g:?}"),
            );
        }
    }

    #[test]
    fn a_window_as_long_as_the_keys_is_plain_causal() {
        let mut rng = Rng(5);
        let g = attn_geoms()[1];
        let (q, k, v) = attn_inputs(&g, &mut rng);
        for w in [g.t_k, g.t_k + 3] {
            let windowed = AttnGeom {
                attn: AttnParams {
                    window: Some(w),
                    ..g.attn
                },
                ..g
            };
            assert_eq!(attn_fwd(&windowed, &q, &k, &v), attn_fwd(&g, &q, &k, &v));
        }
    }

    #[test]
    fn attention_backward_matches_finite_differences() {
        let mut rng = Rng(13);
        for g in attn_geoms() {
            let (q, k, v) = attn_inputs(&g, &mut rng);
            let r = rng.vec(q.len());
            let grad = |which, len| {
                let mut d = vec![f32::NAN; len];
                attention_backward(&g, &q, &k, &v, &r, which, &mut d);
                d
            };
            let want_q = central_diff(&q, 1e-2, |x| dot(&attn_fwd(&g, x, &k, &v), &r));
            let want_k = central_diff(&k, 1e-2, |x| dot(&attn_fwd(&g, &q, x, &v), &r));
            let want_v = central_diff(&v, 1e-2, |x| dot(&attn_fwd(&g, &q, &k, x), &r));
            assert_close(&grad(AttnInput::Q, q.len()), &want_q, 1e-2, "dq");
            assert_close(&grad(AttnInput::K, k.len()), &want_k, 1e-2, "dk");
            assert_close(&grad(AttnInput::V, v.len()), &want_v, 1e-2, "dv");
        }
    }

    #[test]
    fn attention_is_deterministic() {
        let g = AttnGeom {
            b: 3,
            t_q: 33,
            t_k: 33,
            attn: AttnParams {
                heads: 4,
                kv_heads: 1,
                causal: true,
                scale: 0.35,
                window: None,
            },
            head_dim: 8,
            operand: crate::ir::DType::F32,
        };
        let (q, k, v) = attn_inputs(&g, &mut Rng(21));
        let dk = || {
            let mut d = vec![0.0; k.len()];
            attention_backward(&g, &q, &k, &v, &q, AttnInput::K, &mut d);
            d
        };
        assert_eq!(dk(), dk());
        assert_eq!(attn_fwd(&g, &q, &k, &v), attn_fwd(&g, &q, &k, &v));
    }
}
