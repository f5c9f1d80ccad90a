//! Layer, RMS, batch (training statistics) and group normalization: forward and the input,
//! weight and bias backwards. Statistics accumulate in f64 in a fixed order.

use rayon::prelude::*;

use crate::ir::NormKind;

/// How x splits into contiguous chunks, each lying inside one statistics group.
struct Layout {
    kind: NormKind,
    /// Elements per chunk: the row (Layer/Rms), one spatial plane (Batch), one group (Group).
    chunk: usize,
    /// Number of chunks in x.
    chunks: usize,
    /// Channel count (length of weight/bias).
    channels: usize,
    /// Spatial size (1 for Layer/Rms).
    spatial: usize,
    /// Number of statistics groups.
    groups: usize,
}

/// Per-group statistics; `mg` / `mgx` are mean(g) and mean(g * xhat) with g = dy * weight.
#[derive(Clone, Copy, Default)]
struct Stats {
    mean: f32,
    rstd: f32,
    mg: f32,
    mgx: f32,
}

impl Layout {
    fn new(kind: NormKind, shape: &[usize]) -> Self {
        let numel: usize = shape.iter().product();
        let (channels, spatial) = match kind {
            NormKind::Layer | NormKind::Rms => (shape.last().copied().unwrap_or(1), 1),
            NormKind::Batch | NormKind::Group(_) => {
                debug_assert!(shape.len() >= 2);
                (shape[1], shape[2..].iter().product())
            }
        };
        let chunk = match kind {
            NormKind::Layer | NormKind::Rms => channels,
            NormKind::Batch => spatial,
            NormKind::Group(g) => {
                debug_assert!(g > 0 && channels % g == 0);
                channels / g.max(1) * spatial
            }
        };
        let chunks = numel.checked_div(chunk).unwrap_or(0);
        let groups = match kind {
            NormKind::Batch => channels,
            _ => chunks,
        };
        Layout {
            kind,
            chunk,
            chunks,
            channels,
            spatial,
            groups,
        }
    }

    /// Statistics group of chunk `k`.
    fn group_of(&self, k: usize) -> usize {
        match self.kind {
            NormKind::Batch => k % self.channels,
            _ => k,
        }
    }

    /// Channel of element `t` of chunk `k`.
    fn channel(&self, k: usize, t: usize) -> usize {
        match self.kind {
            NormKind::Layer | NormKind::Rms => t,
            NormKind::Batch => k % self.channels,
            NormKind::Group(g) => (k % g) * (self.channels / g) + t / self.spatial,
        }
    }

    /// Calls `f(flat index, channel)` on every element of statistics group `grp`, in order.
    fn for_each_in_group(&self, grp: usize, mut f: impl FnMut(usize, usize)) {
        let (first, step, count) = match self.kind {
            NormKind::Batch => (grp, self.channels, self.chunks / self.channels.max(1)),
            _ => (grp, 1, 1),
        };
        for k in (0..count).map(|i| first + i * step) {
            (0..self.chunk).for_each(|t| f(k * self.chunk + t, self.channel(k, t)));
        }
    }

    /// Statistics of group `grp`; with `grad = Some((dy, weight))` also the backward means.
    fn stats(&self, eps: f32, x: &[f32], grp: usize, grad: Option<(&[f32], &[f32])>) -> Stats {
        let count = (self.chunk * self.chunks / self.groups.max(1)).max(1) as f64;
        let mut mean = 0.0f64;
        if self.kind != NormKind::Rms {
            self.for_each_in_group(grp, |i, _| mean += f64::from(x[i]));
            mean /= count;
        }
        let mut var = 0.0f64;
        self.for_each_in_group(grp, |i, _| var += (f64::from(x[i]) - mean).powi(2));
        let rstd = 1.0 / (var / count + f64::from(eps)).sqrt();
        let mut st = Stats {
            mean: mean as f32,
            rstd: rstd as f32,
            ..Stats::default()
        };
        if let Some((dy, w)) = grad {
            let (mut mg, mut mgx) = (0.0f64, 0.0f64);
            self.for_each_in_group(grp, |i, ch| {
                let g = f64::from(dy[i] * w[ch]);
                mg += g;
                mgx += g * (f64::from(x[i]) - mean) * rstd;
            });
            if self.kind != NormKind::Rms {
                st.mg = (mg / count) as f32;
            }
            st.mgx = (mgx / count) as f32;
        }
        st
    }

    /// Per-group statistics precomputed when several chunks share a group (Batch: O(channels)
    /// entries); empty otherwise, in which case `get` computes them per chunk.
    fn table(&self, eps: f32, x: &[f32], grad: Option<(&[f32], &[f32])>) -> Vec<Stats> {
        if self.kind == NormKind::Batch {
            (0..self.groups)
                .into_par_iter()
                .map(|g| self.stats(eps, x, g, grad))
                .collect()
        } else {
            Vec::new()
        }
    }

    /// Statistics of the group of chunk `k`, from `table` when it has them.
    fn get(
        &self,
        table: &[Stats],
        eps: f32,
        x: &[f32],
        k: usize,
        grad: Option<(&[f32], &[f32])>,
    ) -> Stats {
        let g = self.group_of(k);
        table
            .get(g)
            .copied()
            .unwrap_or_else(|| self.stats(eps, x, g, grad))
    }

    /// Writes `out[i] = f(stats, i, channel)` for every element, parallel over chunks.
    fn map(
        &self,
        eps: f32,
        x: &[f32],
        grad: Option<(&[f32], &[f32])>,
        out: &mut [f32],
        f: impl Fn(Stats, usize, usize) -> f32 + Sync,
    ) {
        if self.chunk == 0 || out.is_empty() {
            return;
        }
        let table = self.table(eps, x, grad);
        out.par_chunks_mut(self.chunk)
            .enumerate()
            .for_each(|(k, o)| {
                let st = self.get(&table, eps, x, k, grad);
                for (t, o) in o.iter_mut().enumerate() {
                    *o = f(st, k * self.chunk + t, self.channel(k, t));
                }
            });
    }

    /// Writes per-channel sums of `f(stats, i)` over all elements into `acc`, accumulated in
    /// f64 in a fixed order; statistics come from `stats = Some((eps, x))`, else are zero.
    fn channel_sums(
        &self,
        stats: Option<(f32, &[f32])>,
        acc: &mut [f32],
        f: impl Fn(Stats, usize) -> f64,
    ) {
        let mut sums = vec![0.0f64; self.channels];
        let table = stats.map_or_else(Vec::new, |(eps, x)| self.table(eps, x, None));
        for k in 0..self.chunks {
            let st =
                stats.map_or_else(Stats::default, |(eps, x)| self.get(&table, eps, x, k, None));
            (0..self.chunk).for_each(|t| sums[self.channel(k, t)] += f(st, k * self.chunk + t));
        }
        acc.iter_mut().zip(&sums).for_each(|(a, &s)| *a = s as f32);
    }
}

/// Computes `out = normalize(x) * weight + bias` (`bias` is None for Rms or when absent).
pub fn norm_forward(
    kind: NormKind,
    eps: f32,
    x: &[f32],
    shape: &[usize],
    weight: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    let l = Layout::new(kind, shape);
    l.map(eps, x, None, out, |st, i, ch| {
        (x[i] - st.mean) * st.rstd * weight[ch] + bias.map_or(0.0, |b| b[ch])
    });
}

/// Computes dx for `out = norm(x) * weight + bias` given `dy`, recomputing statistics from x:
/// `dx = rstd * (g - mean(g) - xhat * mean(g * xhat))` with `g = dy * weight` (no `mean(g)`
/// term for Rms).
pub fn norm_backward_input(
    kind: NormKind,
    eps: f32,
    x: &[f32],
    shape: &[usize],
    weight: &[f32],
    dy: &[f32],
    dx: &mut [f32],
) {
    let l = Layout::new(kind, shape);
    l.map(eps, x, Some((dy, weight)), dx, |st, i, ch| {
        let xhat = (x[i] - st.mean) * st.rstd;
        st.rstd * (dy[i] * weight[ch] - st.mg - xhat * st.mgx)
    });
}

/// Adds `g` to `dx` element by element (`dx = g + dx`, one rounding each): the residual
/// gradient a norm's input gradient takes in (`passes::norm_accumulate`).
pub fn accumulate(dx: &mut [f32], g: &[f32]) {
    for (d, &g) in dx.iter_mut().zip(g) {
        *d += g;
    }
}

/// Computes `dweight = sum over non-channel positions of dy * normalize(x)`.
pub fn norm_backward_weight(
    kind: NormKind,
    eps: f32,
    x: &[f32],
    shape: &[usize],
    dy: &[f32],
    dw: &mut [f32],
) {
    let l = Layout::new(kind, shape);
    l.channel_sums(Some((eps, x)), dw, |st, i| {
        f64::from(dy[i]) * f64::from((x[i] - st.mean) * st.rstd)
    });
}

/// Computes `dbias = sum over non-channel positions of dy`.
pub fn norm_backward_bias(kind: NormKind, dy: &[f32], shape: &[usize], db: &mut [f32]) {
    Layout::new(kind, shape).channel_sums(None, db, |_, i| f64::from(dy[i]));
}

/// Moves batch norm's running statistics towards the per-channel mean and unbiased variance
/// of `x` (`[N, C, ...]`, more than one value per channel; sums in f64 in a fixed order):
/// `r = (1 - momentum) * r + momentum * batch`, as `torch.nn.BatchNorm` in training mode.
pub fn batch_norm_stats(
    momentum: f32,
    x: &[f32],
    shape: &[usize],
    running_mean: &mut [f32],
    running_var: &mut [f32],
) {
    let l = Layout::new(NormKind::Batch, shape);
    let count = (l.chunk * l.chunks / l.groups.max(1)) as f64;
    let m = f64::from(momentum);
    for c in 0..l.channels {
        let mut sum = 0.0f64;
        l.for_each_in_group(c, |i, _| sum += f64::from(x[i]));
        let mean = sum / count;
        let mut sq = 0.0f64;
        l.for_each_in_group(c, |i, _| sq += (f64::from(x[i]) - mean).powi(2));
        let var = sq / (count - 1.0).max(1.0);
        running_mean[c] = ((1.0 - m) * f64::from(running_mean[c]) + m * mean) as f32;
        running_var[c] = ((1.0 - m) * f64::from(running_var[c]) + m * var) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::kernels::testing::{central_diff, dot, rel_err, Rng};

    const EPS: f32 = 1e-5;

    fn cases() -> Vec<(NormKind, Vec<usize>, usize)> {
        // (kind, shape, channels)
        vec![
            (NormKind::Layer, vec![3, 4, 6], 6),
            (NormKind::Rms, vec![5, 7], 7),
            (NormKind::Batch, vec![3, 4, 2, 3], 4),
            (NormKind::Batch, vec![6, 5], 5),
            (NormKind::Group(2), vec![2, 6, 5], 6),
            (NormKind::Group(2), vec![3, 8], 8),
        ]
    }

    /// Naive f64 reference: normalized value and channel for every element.
    fn naive_forward(
        kind: NormKind,
        x: &[f32],
        shape: &[usize],
        w: &[f32],
        b: Option<&[f32]>,
    ) -> Vec<f64> {
        let numel = x.len();
        let (c, s) = match kind {
            NormKind::Layer | NormKind::Rms => (shape[shape.len() - 1], 1),
            _ => (shape[1], shape[2..].iter().product()),
        };
        // Group key and channel of flat index i.
        let key_ch = |i: usize| -> (usize, usize) {
            match kind {
                NormKind::Layer | NormKind::Rms => (i / c, i % c),
                NormKind::Batch => ((i / s) % c, (i / s) % c),
                NormKind::Group(g) => {
                    let ch = (i / s) % c;
                    ((i / (c * s)) * g + ch / (c / g), ch)
                }
            }
        };
        let mut out = vec![0.0; numel];
        let keys: Vec<usize> = (0..numel).map(|i| key_ch(i).0).collect();
        for key in 0..=keys.iter().copied().max().unwrap_or(0) {
            let members: Vec<usize> = (0..numel).filter(|&i| keys[i] == key).collect();
            let n = members.len() as f64;
            let mean = if kind == NormKind::Rms {
                0.0
            } else {
                members.iter().map(|&i| f64::from(x[i])).sum::<f64>() / n
            };
            let var = members
                .iter()
                .map(|&i| (f64::from(x[i]) - mean).powi(2))
                .sum::<f64>()
                / n;
            for &i in &members {
                let ch = key_ch(i).1;
                let xhat = (f64::from(x[i]) - mean) / (var + f64::from(EPS)).sqrt();
                out[i] = xhat * f64::from(w[ch]) + b.map_or(0.0, |b| f64::from(b[ch]));
            }
        }
        out
    }

    #[test]
    fn forward_matches_naive() {
        let mut rng = Rng(21);
        for (kind, shape, c) in cases() {
            let x = rng.vec(shape.iter().product());
            let w = rng.vec(c);
            let b = rng.vec(c);
            let bias = (kind != NormKind::Rms).then_some(&b[..]);
            let mut out = vec![f32::NAN; x.len()];
            norm_forward(kind, EPS, &x, &shape, &w, bias, &mut out);
            let want = naive_forward(kind, &x, &shape, &w, bias);
            for (o, w) in out.iter().zip(&want) {
                assert!((f64::from(*o) - w).abs() < 1e-5, "{kind:?} {o} {w}");
            }
        }
    }

    /// Tolerance: relative L2 error 1e-2 against h = 1e-2 central differences on f32.
    #[test]
    fn backwards_match_finite_differences() {
        let mut rng = Rng(33);
        for (kind, shape, c) in cases() {
            let n: usize = shape.iter().product();
            let x: Vec<f32> = rng.vec(n).iter().map(|v| v * 2.0).collect();
            let w = rng.vec(c);
            let b = rng.vec(c);
            let dy = rng.vec(n);
            let has_bias = kind != NormKind::Rms;
            let run = |x: &[f32], w: &[f32], b: &[f32]| {
                let mut o = vec![0.0; n];
                norm_forward(kind, EPS, x, &shape, w, has_bias.then_some(b), &mut o);
                o
            };
            let mut dx = vec![f32::NAN; n];
            norm_backward_input(kind, EPS, &x, &shape, &w, &dy, &mut dx);
            let e = rel_err(&dx, &central_diff(&x, 1e-2, |x| dot(&run(x, &w, &b), &dy)));
            assert!(e < 1e-2, "{kind:?} dx err {e}");
            let mut dw = vec![f32::NAN; c];
            norm_backward_weight(kind, EPS, &x, &shape, &dy, &mut dw);
            let e = rel_err(&dw, &central_diff(&w, 1e-2, |w| dot(&run(&x, w, &b), &dy)));
            assert!(e < 1e-2, "{kind:?} dw err {e}");
            if has_bias {
                let mut db = vec![f32::NAN; c];
                norm_backward_bias(kind, &dy, &shape, &mut db);
                let e = rel_err(&db, &central_diff(&b, 1e-2, |b| dot(&run(&x, &w, b), &dy)));
                assert!(e < 1e-2, "{kind:?} db err {e}");
            }
        }
    }

    #[test]
    fn empty_input_is_harmless() {
        let mut dw = [f32::NAN; 3];
        norm_backward_weight(NormKind::Batch, EPS, &[], &[0, 3], &[], &mut dw);
        assert_eq!(dw, [0.0; 3]);
        norm_forward(NormKind::Layer, EPS, &[], &[0, 3], &[1.0; 3], None, &mut []);
    }
}
