//! Where each tile and its window lie along a tiled axis, and copying boxes of row-major
//! tensors between the whole input or output and a window.

/// One tile along one axis: it keeps the voxels `[at, at + len)` of the output, computed
/// from the window of the input starting at `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span1 {
    /// The window's first voxel in the whole input.
    pub start: usize,
    /// The first voxel the tile keeps in the whole output.
    pub at: usize,
    /// How many voxels the tile keeps: the tile's side, or for the last tile of a side that
    /// the tile does not divide, the voxels no earlier tile kept.
    pub len: usize,
}

/// The tiles along an axis of `side` input voxels whose output covers the first `extent`
/// (the side, less what unpadded convolutions drop at its end), cut into tiles of `tile`
/// (at most `extent`), each window `window` long (at most `side`): `lo` voxels before the
/// tile where the input has them, pushed inward at the input's border so that a window
/// never reaches past it (there the window's own padding, and what it drops, is the whole
/// input's). Where `tile` does not divide `extent`, the last tile is pushed inward with its
/// window and keeps only the voxels after the previous tile: every output voxel is kept by
/// exactly one tile.
pub fn spans(side: usize, extent: usize, tile: usize, window: usize, lo: usize) -> Vec<Span1> {
    (0..extent.div_ceil(tile))
        .map(|k| {
            let at = k * tile;
            Span1 {
                start: at.saturating_sub(lo).min(side - window),
                at,
                len: tile.min(extent - at),
            }
        })
        .collect()
}

/// Copies the box of `extent` at `from_at` in `from` (row-major, shape `from_shape`) to
/// `to_at` in `to` (shape `to_shape`). The caller keeps every box inside its tensor.
pub fn copy_box(
    (from, from_shape, from_at): (&[f32], &[usize], &[usize]),
    (to, to_shape, to_at): (&mut [f32], &[usize], &[usize]),
    extent: &[usize],
) {
    let rank = extent.len();
    if rank == 0 || extent.contains(&0) {
        return;
    }
    let strides = |shape: &[usize]| {
        let mut s = vec![1usize; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            s[i] = s[i + 1] * shape[i + 1];
        }
        s
    };
    let (fs, ts) = (strides(from_shape), strides(to_shape));
    let row = extent[rank - 1];
    let mut index = vec![0usize; rank - 1];
    loop {
        let offset = |at: &[usize], s: &[usize]| {
            (0..rank)
                .map(|d| (at[d] + index.get(d).copied().unwrap_or(0)) * s[d])
                .sum::<usize>()
        };
        let (f, t) = (offset(from_at, &fs), offset(to_at, &ts));
        to[t..t + row].copy_from_slice(&from[f..f + row]);
        let mut d = rank - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            index[d] += 1;
            if index[d] < extent[d] {
                break;
            }
            index[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_stay_inside_the_input() {
        let s = spans(256, 256, 64, 176, 56);
        let starts: Vec<usize> = s.iter().map(|w| w.start).collect();
        assert_eq!(starts, vec![0, 8, 72, 80]);
        for w in &s {
            assert!(w.start + 176 <= 256);
            assert!(w.start <= w.at && w.at + 64 <= w.start + 176);
        }
    }

    #[test]
    fn the_last_tile_of_a_side_it_does_not_divide_keeps_the_rest() {
        // 128 in tiles of 48 (halo 8 and 8, windows of 64): 48 + 48 + 32.
        let s = spans(128, 128, 48, 64, 8);
        let kept: Vec<(usize, usize, usize)> = s.iter().map(|w| (w.start, w.at, w.len)).collect();
        assert_eq!(kept, vec![(0, 0, 48), (40, 48, 48), (64, 96, 32)]);
        let mut covered = vec![0u32; 128];
        for w in &s {
            // The window holds the kept voxels' halo, or ends at the input's border.
            assert!(w.start + 64 <= 128 && (w.start + 8 <= w.at || w.start == 0));
            assert!(w.at + w.len + 8 <= w.start + 64 || w.start + 64 == 128);
            for c in &mut covered[w.at..w.at + w.len] {
                *c += 1;
            }
        }
        assert!(covered.iter().all(|&c| c == 1), "{covered:?}");
    }

    #[test]
    fn copies_a_box_between_shapes() {
        let from: Vec<f32> = (0..24).map(|i| i as f32).collect();
        let mut to = vec![0.0; 8];
        copy_box(
            (&from, &[2, 3, 4], &[0, 1, 1]),
            (&mut to, &[2, 2, 2], &[0, 0, 0]),
            &[2, 2, 2],
        );
        assert_eq!(to, vec![5.0, 6.0, 9.0, 10.0, 17.0, 18.0, 21.0, 22.0]);
    }
}
