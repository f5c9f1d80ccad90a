//! Data-movement kernels on f32 tensors: permute, slice along an axis, its zero-padding
//! inverse, and concatenation.

use rayon::prelude::*;

use crate::exec::kernels::layout::{axis_split, contiguous_strides, for_rows, row_offset};

/// Calls `f(outer_index, block)` in parallel on consecutive `block`-sized pieces of `out`.
fn blocks(out: &mut [f32], block: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    if block == 0 || out.is_empty() {
        return;
    }
    out.par_chunks_mut(block)
        .enumerate()
        .for_each(|(o, b)| f(o, b));
}

/// Writes `x` permuted into `out`: out dim `i` is x dim `perm[i]`.
pub fn permute(x: &[f32], shape: &[usize], perm: &[usize], out: &mut [f32]) {
    debug_assert_eq!(shape.len(), perm.len());
    let xs = contiguous_strides(shape);
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let strides: Vec<usize> = perm.iter().map(|&p| xs[p]).collect();
    let inner = strides.last().copied().unwrap_or(0);
    for_rows(out, &out_shape, |r, row| {
        let off = row_offset(r, &out_shape, &strides);
        row.iter_mut()
            .enumerate()
            .for_each(|(t, o)| *o = x[off + t * inner]);
    });
}

/// Writes `x[..., start..end, ...]` (the range taken along `axis`) into `out`.
pub fn slice(x: &[f32], shape: &[usize], axis: usize, start: usize, end: usize, out: &mut [f32]) {
    debug_assert!(start <= end && end <= shape[axis]);
    let (_, full, inner) = axis_split(shape, axis);
    let len = (end - start) * inner;
    blocks(out, len, |o, b| {
        let src = o * full * inner + start * inner;
        b.copy_from_slice(&x[src..src + len]);
    });
}

/// Inverse of [`slice`]: `out` (x's `shape` with dim `axis` replaced by `full`) is zero except
/// `out[..., start..start + shape[axis], ...] = x`.
pub fn pad_slice(
    x: &[f32],
    shape: &[usize],
    axis: usize,
    start: usize,
    full: usize,
    out: &mut [f32],
) {
    let (_, len, inner) = axis_split(shape, axis);
    debug_assert!(start + len <= full);
    let (lo, hi) = (start * inner, (start + len) * inner);
    blocks(out, full * inner, |o, b| {
        b[..lo].fill(0.0);
        b[lo..hi].copy_from_slice(&x[o * len * inner..(o + 1) * len * inner]);
        b[hi..].fill(0.0);
    });
}

/// Writes the concatenation of `parts` (each `(data, shape)`, equal except along `axis`)
/// along `axis` into `out`.
pub fn concat(parts: &[(&[f32], &[usize])], axis: usize, out: &mut [f32]) {
    let widths: Vec<usize> = parts
        .iter()
        .map(|(_, s)| {
            let (_, n, inner) = axis_split(s, axis);
            n * inner
        })
        .collect();
    blocks(out, widths.iter().sum(), |o, b| {
        let mut at = 0;
        for ((data, _), &w) in parts.iter().zip(&widths) {
            b[at..at + w].copy_from_slice(&data[o * w..(o + 1) * w]);
            at += w;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::kernels::testing::unravel;

    fn iota(n: usize) -> Vec<f32> {
        (0..n).map(|v| v as f32).collect()
    }

    fn ravel(idx: &[usize], shape: &[usize]) -> usize {
        idx.iter().zip(shape).fold(0, |acc, (&i, &e)| acc * e + i)
    }

    #[test]
    fn permute_matches_naive() {
        let shape = [2, 3, 4, 5];
        let x = iota(120);
        for perm in [[0, 1, 2, 3], [3, 2, 1, 0], [0, 2, 1, 3], [1, 3, 0, 2]] {
            let os: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
            let mut out = vec![f32::NAN; 120];
            permute(&x, &shape, &perm, &mut out);
            for (i, &v) in out.iter().enumerate() {
                let oi = unravel(i, &os);
                let mut xi = [0; 4];
                for (d, &p) in perm.iter().enumerate() {
                    xi[p] = oi[d];
                }
                assert_eq!(v, x[ravel(&xi, &shape)], "{perm:?}");
            }
        }
    }

    #[test]
    fn slice_pad_and_concat_round_trip() {
        let shape = [2, 5, 3];
        let x = iota(30);
        for axis in 0..3 {
            let full = shape[axis];
            let (start, end) = (1.min(full - 1), full);
            let mut ps = shape;
            ps[axis] = end - start;
            let n: usize = ps.iter().product();
            let mut part = vec![f32::NAN; n];
            slice(&x, &shape, axis, start, end, &mut part);
            for (i, &v) in part.iter().enumerate() {
                let mut idx = unravel(i, &ps);
                idx[axis] += start;
                assert_eq!(v, x[ravel(&idx, &shape)]);
            }
            let mut padded = vec![f32::NAN; 30];
            pad_slice(&part, &ps, axis, start, full, &mut padded);
            for (i, &v) in padded.iter().enumerate() {
                let inside = unravel(i, &shape)[axis] >= start;
                assert_eq!(v, if inside { x[i] } else { 0.0 });
            }
            // Concatenating the head and the tail slices gives back x.
            let mut hs = shape;
            hs[axis] = start;
            let mut head = vec![0.0; hs.iter().product()];
            slice(&x, &shape, axis, 0, start, &mut head);
            let mut back = vec![f32::NAN; 30];
            concat(&[(&head, &hs), (&part, &ps)], axis, &mut back);
            assert_eq!(back, x, "axis {axis}");
        }
    }
}
