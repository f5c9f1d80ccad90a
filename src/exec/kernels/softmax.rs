//! Softmax along an axis and row log-sum-exp: shared by the softmax family and the
//! cross-entropy loss, which must agree with it bit for bit. Sums accumulate in f64.

use rayon::prelude::*;

use super::layout::axis_split;

/// Runs `f(a_lane, b_lane, out_lane, n, stride)` on every lane along `axis`: lane element `t`
/// is at index `t * stride` of each lane slice. Parallel over the outer blocks.
pub(crate) fn lanes(
    shape: &[usize],
    axis: usize,
    a: &[f32],
    b: &[f32],
    out: &mut [f32],
    f: impl Fn(&[f32], &[f32], &mut [f32], usize, usize) + Sync,
) {
    let (_, n, inner) = axis_split(shape, axis);
    let block = n * inner;
    if block == 0 || out.is_empty() {
        return;
    }
    out.par_chunks_mut(block)
        .zip(a.par_chunks(block).zip(b.par_chunks(block)))
        .for_each(|(o, (a, b))| {
            (0..inner).for_each(|k| f(&a[k..], &b[k..], &mut o[k..], n, inner))
        });
}

/// Max and log-sum-exp shift of lane `x` (n elements at stride `s`): returns (max, ln sum exp(x - max)).
pub(crate) fn lane_logsumexp(x: &[f32], n: usize, s: usize) -> (f32, f32) {
    let m = (0..n).fold(f32::NEG_INFINITY, |m, t| m.max(x[t * s]));
    let sum: f64 = (0..n).map(|t| f64::from((x[t * s] - m).exp())).sum();
    (m, sum.ln() as f32)
}

/// Log-sum-exp of a contiguous row: `ln(sum(exp(row)))`, numerically stable.
pub(crate) fn logsumexp(row: &[f32]) -> f32 {
    let (m, l) = lane_logsumexp(row, row.len(), 1);
    m + l
}

/// Softmax of `x` along `axis`: `out = exp(x - max) / sum(exp(x - max))`.
pub fn softmax(x: &[f32], shape: &[usize], axis: usize, out: &mut [f32]) {
    lanes(shape, axis, x, x, out, |x, _, o, n, s| {
        let (m, l) = lane_logsumexp(x, n, s);
        (0..n).for_each(|t| o[t * s] = (x[t * s] - m - l).exp());
    });
}
