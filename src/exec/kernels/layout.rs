//! Shape and stride helpers shared by the elementwise, reduction, movement and dense CPU
//! kernels of several op families, the parallel row/chunk loops they split work with, and
//! the output extent of a sliding window (convolution, pooling).

use rayon::prelude::*;

/// Elements per parallel task for flat elementwise loops.
pub(crate) const CHUNK: usize = 4096;

/// Row-major (contiguous) strides of `shape`.
pub(crate) fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    strides
}

/// Strides of a contiguous tensor of `shape` viewed with numpy broadcasting as `out_shape`:
/// `shape` is right-aligned to `out_shape`, and missing or size-1 dims get stride 0.
pub(crate) fn broadcast_strides(shape: &[usize], out_shape: &[usize]) -> Vec<usize> {
    debug_assert!(shape.len() <= out_shape.len());
    let lead = out_shape.len() - shape.len();
    let own = contiguous_strides(shape);
    (0..out_shape.len())
        .map(|d| match d.checked_sub(lead) {
            Some(s) if shape[s] != 1 => {
                debug_assert_eq!(shape[s], out_shape[d]);
                own[s]
            }
            _ => 0,
        })
        .collect()
}

/// Source offset of the first element of row `row` (rows run along the last dim of
/// `out_shape`) for a view with per-dim `strides` over `out_shape`.
pub(crate) fn row_offset(mut row: usize, out_shape: &[usize], strides: &[usize]) -> usize {
    let mut off = 0;
    for d in (0..out_shape.len().saturating_sub(1)).rev() {
        off += (row % out_shape[d]) * strides[d];
        row /= out_shape[d];
    }
    off
}

/// Calls `f(row_index, row)` in parallel for every row (along the last dim of `out_shape`)
/// of `out`; each row is written by exactly one call.
pub(crate) fn for_rows(out: &mut [f32], out_shape: &[usize], f: impl Fn(usize, &mut [f32]) + Sync) {
    let len = out_shape.last().copied().unwrap_or(1);
    if out.is_empty() || len == 0 {
        return;
    }
    out.par_chunks_mut(len)
        .enumerate()
        .with_min_len((CHUNK / len).max(1))
        .for_each(|(r, row)| f(r, row));
}

/// Splits `shape` around `axis` into (outer, axis extent, inner) element counts.
pub(crate) fn axis_split(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    debug_assert!(axis < shape.len());
    let outer = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product();
    (outer, shape[axis], inner)
}

/// Runs `f(dst_chunk, i)` over the `dst.len() / chunk` consecutive chunks in parallel.
pub(crate) fn par_chunks(
    dst: &mut [f32],
    chunk: usize,
    f: impl Fn(&mut [f32], usize) + Sync + Send,
) {
    if chunk > 0 {
        dst.par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, d)| f(d, i));
    }
}

/// Output length of a sliding window (floor mode, zero padding).
pub(crate) fn out_len(size: usize, k: usize, stride: usize, pad: usize, dil: usize) -> usize {
    let eff = dil * k.saturating_sub(1) + 1;
    let padded = size + 2 * pad;
    if k == 0 || padded < eff {
        0
    } else {
        (padded - eff) / stride + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stride_helpers() {
        assert_eq!(contiguous_strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(broadcast_strides(&[3, 1], &[2, 3, 4]), vec![0, 1, 0]);
        assert_eq!(axis_split(&[2, 3, 4, 5], 2), (6, 4, 5));
        assert_eq!(row_offset(5, &[2, 3, 4], &[12, 4, 1]), 20);
    }
}
