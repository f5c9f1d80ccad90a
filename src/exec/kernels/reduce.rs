//! Reductions over broadcast dims (sum, max and its backward) and broadcasting: the kernels
//! of the reduce family, kept here because they are public (the CUDA comparison tests use
//! `max_to` as their reference) and the pointwise tests check binary gradients with them.
//! Sums accumulate in f64 in a fixed order.

use rayon::prelude::*;

use super::layout::{broadcast_strides, contiguous_strides, for_rows, row_offset};

/// Maps each output element of a reduction to the group of input offsets reduced into it.
struct Groups {
    /// (out extent, x stride) of every kept dim with extent > 1, outermost first.
    kept: Vec<(usize, usize)>,
    /// (extent, x stride) of every reduced dim, outermost first.
    red: Vec<(usize, usize)>,
}

impl Groups {
    /// Reduction of `x_shape` to `out_shape` (right-aligned; out dims are 1 or equal to x).
    fn new(x_shape: &[usize], out_shape: &[usize]) -> Self {
        debug_assert!(out_shape.len() <= x_shape.len());
        let lead = x_shape.len() - out_shape.len();
        let xs = contiguous_strides(x_shape);
        let (mut kept, mut red) = (Vec::new(), Vec::new());
        for (d, (&ext, &stride)) in x_shape.iter().zip(&xs).enumerate() {
            let o = if d < lead { 1 } else { out_shape[d - lead] };
            if o == ext && ext != 1 {
                kept.push((ext, stride));
            } else if o == 1 && ext != 1 {
                red.push((ext, stride));
            }
            debug_assert!(
                o == ext || o == 1,
                "{x_shape:?} does not reduce to {out_shape:?}"
            );
        }
        Groups { kept, red }
    }

    /// Offset in x of the first element of output `j`'s group.
    fn base(&self, mut j: usize) -> usize {
        let mut off = 0;
        for &(ext, stride) in self.kept.iter().rev() {
            off += (j % ext) * stride;
            j /= ext;
        }
        off
    }

    /// Calls `f` on every x offset of the group starting at `base`, in x's row-major order.
    fn for_each(&self, base: usize, mut f: impl FnMut(usize)) {
        let Some((&(n_in, s_in), outer)) = self.red.split_last() else {
            f(base);
            return;
        };
        let n_outer: usize = outer.iter().map(|&(e, _)| e).product();
        for q in 0..n_outer {
            let (mut rest, mut off) = (q, base);
            for &(ext, stride) in outer.iter().rev() {
                off += (rest % ext) * stride;
                rest /= ext;
            }
            (0..n_in).for_each(|t| f(off + t * s_in));
        }
    }
}

/// Sums `x` over its broadcast dims so the result has `out_shape` (numpy broadcasting in
/// reverse: `out_shape` may have lower rank; dims where out has 1 and x more are summed).
pub fn sum_to(x: &[f32], x_shape: &[usize], out: &mut [f32], out_shape: &[usize]) {
    reduce_groups(x_shape, out, out_shape, |g, base| {
        let mut s = 0.0f64;
        g.for_each(base, |i| s += f64::from(x[i]));
        s as f32
    });
}

/// Sets each `out[j]` to `reduce(groups, base)` of output `j`'s group of input elements.
fn reduce_groups(
    x_shape: &[usize],
    out: &mut [f32],
    out_shape: &[usize],
    reduce: impl Fn(&Groups, usize) -> f32 + Sync,
) {
    let g = Groups::new(x_shape, out_shape);
    out.par_iter_mut()
        .enumerate()
        .with_min_len(256)
        .for_each(|(j, o)| *o = reduce(&g, g.base(j)));
}

/// Broadcasts `x` (whose `x_shape` is broadcastable to `out_shape`) to `out_shape`.
pub fn broadcast_to(x: &[f32], x_shape: &[usize], out: &mut [f32], out_shape: &[usize]) {
    let s = broadcast_strides(x_shape, out_shape);
    let inner = s.last().copied().unwrap_or(0);
    for_rows(out, out_shape, |r, row| {
        let off = row_offset(r, out_shape, &s);
        row.iter_mut()
            .enumerate()
            .for_each(|(t, o)| *o = x[off + t * inner]);
    });
}

/// Takes the max over the axes where `out_shape` (same rank as `x_shape`, keepdim) has 1 and
/// x has more; an empty group yields negative infinity.
pub fn max_to(x: &[f32], x_shape: &[usize], out: &mut [f32], out_shape: &[usize]) {
    reduce_groups(x_shape, out, out_shape, |g, base| {
        let mut m = f32::NEG_INFINITY;
        g.for_each(base, |i| m = m.max(x[i]));
        m
    });
}

/// Backward of [`max_to`]: each `dy` element (shape `out_shape`) flows to the first element
/// of its group (in row-major order) equal to the forward output `y`; all other dx are 0.
pub fn max_to_backward(
    x: &[f32],
    x_shape: &[usize],
    y: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    out_shape: &[usize],
) {
    let g = Groups::new(x_shape, out_shape);
    dx.fill(0.0);
    for (j, (&m, &d)) in y.iter().zip(dy).enumerate() {
        let mut hit = None;
        g.for_each(g.base(j), |i| {
            if hit.is_none() && x[i] == m {
                hit = Some(i);
            }
        });
        if let Some(i) = hit {
            dx[i] = d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::softmax::softmax;
    use super::super::testing::{unravel, Rng};
    use super::*;

    /// Flat index in `out_shape` (right-aligned, size-1 dims collapsed) of x multi-index `idx`.
    fn reduced_index(idx: &[usize], out_shape: &[usize]) -> usize {
        let lead = idx.len() - out_shape.len();
        out_shape.iter().enumerate().fold(0, |acc, (d, &e)| {
            acc * e + if e == 1 { 0 } else { idx[d + lead] }
        })
    }

    const CASES: [(&[usize], &[usize]); 6] = [
        (&[2, 3, 4], &[1, 3, 1]),
        (&[2, 3, 4], &[4]),
        (&[2, 3, 4], &[3, 1]),
        (&[2, 3, 4], &[2, 3, 4]),
        (&[5, 7], &[]),
        (&[1, 6], &[1]),
    ];

    #[test]
    fn sum_to_and_broadcast_match_naive() {
        let mut rng = Rng(7);
        for (xs, os) in CASES {
            let x = rng.vec(xs.iter().product());
            let mut want = vec![0.0f64; os.iter().product()];
            for (i, &v) in x.iter().enumerate() {
                want[reduced_index(&unravel(i, xs), os)] += f64::from(v);
            }
            let mut out = vec![f32::NAN; want.len()];
            sum_to(&x, xs, &mut out, os);
            for (o, w) in out.iter().zip(&want) {
                assert!((f64::from(*o) - w).abs() < 1e-5, "{xs:?}->{os:?}");
            }
            let mut b = vec![f32::NAN; x.len()];
            broadcast_to(&out, os, &mut b, xs);
            for (i, v) in b.iter().enumerate() {
                assert_eq!(*v, out[reduced_index(&unravel(i, xs), os)]);
            }
        }
    }

    #[test]
    fn max_to_and_backward() {
        let mut rng = Rng(11);
        for (xs, os) in CASES.iter().filter(|(x, o)| x.len() == o.len()) {
            // Quantize so ties occur; the first maximal element must get the gradient.
            let x: Vec<f32> = rng
                .vec(xs.iter().product())
                .iter()
                .map(|v| (v * 2.0).round())
                .collect();
            let n_out: usize = os.iter().product();
            let mut want = vec![f32::NEG_INFINITY; n_out];
            for (i, &v) in x.iter().enumerate() {
                let j = reduced_index(&unravel(i, xs), os);
                want[j] = want[j].max(v);
            }
            let mut y = vec![0.0; n_out];
            max_to(&x, xs, &mut y, os);
            assert_eq!(y, want);
            let dy: Vec<f32> = (0..n_out).map(|j| j as f32 + 1.0).collect();
            let mut dx = vec![f32::NAN; x.len()];
            max_to_backward(&x, xs, &y, &dy, &mut dx, os);
            let mut seen = vec![false; n_out];
            for (i, &v) in x.iter().enumerate() {
                let j = reduced_index(&unravel(i, xs), os);
                let first = !seen[j] && v == y[j];
                seen[j] |= first;
                assert_eq!(dx[i], if first { dy[j] } else { 0.0 });
            }
        }
    }

    #[test]
    fn large_reductions_are_bitwise_deterministic() {
        let x = Rng(23).vec(64 * 1024);
        let run = || {
            let mut s = vec![0.0; 64];
            sum_to(&x, &[1024, 64], &mut s, &[64]);
            let mut sm = vec![0.0; x.len()];
            softmax(&x, &[64, 1024], 1, &mut sm);
            (s, sm)
        };
        let first = run();
        for _ in 0..3 {
            assert_eq!(run(), first);
        }
    }
}
