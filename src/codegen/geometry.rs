//! Shape arithmetic shared by the lowerings: element counts, row-major and broadcast strides,
//! axis splits, block sizes and the reduction geometry `reduce.cu` reads.

use super::build::{c_dims, c_u64};

/// `v` widened to the `u64` the generated constants use.
pub(crate) fn u(v: usize) -> u64 {
    v as u64
}

/// The window constants `SH`, `SW` (stride) and `PH`, `PW` (padding) of a 2-D window op.
pub(crate) fn window_consts(stride: [usize; 2], padding: [usize; 2]) -> [String; 4] {
    [
        c_u64("SH", u(stride[0])),
        c_u64("SW", u(stride[1])),
        c_u64("PH", u(padding[0])),
        c_u64("PW", u(padding[1])),
    ]
}

/// The element count of `shape` (1 for a scalar).
pub(crate) fn numel(shape: &[usize]) -> u64 {
    shape.iter().map(|&d| u(d)).product()
}

/// `shape` as u64 dims.
pub(crate) fn dims(shape: &[usize]) -> Vec<u64> {
    shape.iter().map(|&d| u(d)).collect()
}

/// Row-major strides of `shape`, in elements.
pub(crate) fn contiguous(shape: &[usize]) -> Vec<u64> {
    let mut s = vec![1u64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * u(shape[d + 1]);
    }
    s
}

/// Strides of contiguous `shape` viewed (numpy broadcasting, right-aligned) at `out` rank:
/// 0 on missing and size-1 dims.
pub(crate) fn bcast_strides(shape: &[usize], out: &[usize]) -> Vec<u64> {
    let cs = contiguous(shape);
    let pad = out.len().saturating_sub(shape.len());
    (0..out.len())
        .map(|d| {
            if d < pad {
                0
            } else {
                let k = d - pad;
                if shape[k] == 1 {
                    0
                } else {
                    cs[k]
                }
            }
        })
        .collect()
}

/// Splits `shape` around `axis` into (outer, extent, inner); a missing axis has extent 1.
pub(crate) fn axis_split(shape: &[usize], axis: usize) -> (u64, u64, u64) {
    let outer = numel(&shape[..axis.min(shape.len())]);
    let n = shape.get(axis).map_or(1, |&d| u(d));
    let inner = numel(shape.get(axis + 1..).unwrap_or(&[]));
    (outer, n, inner)
}

/// The smallest power of two times `lo` that covers `n`, capped at `hi`: a block size for
/// a cooperative loop over `n` items.
pub(crate) fn pow2_block(n: u64, lo: u32, hi: u32) -> u32 {
    let mut b = lo;
    while u64::from(b) < n && b < hi {
        b *= 2;
    }
    b
}

/// Most blocks the first launch of a two-stage reduction to a scalar spreads its work over:
/// eight 256-thread blocks for each of the 132 streaming multiprocessors of an H100, enough
/// to fill every one; the partials (8 bytes a block) stay small.
pub(crate) const PARTIAL_BLOCKS: u64 = 8 * SMS;

/// An H100's streaming multiprocessors: a grid of at least this many blocks reaches every one.
pub(crate) const SMS: u64 = 132;

/// Blocks that fill an H100 four times over (132 SMs): a kernel whose natural grid is
/// smaller splits its work (rows into slices, a GEMM's K) until it launches about this many.
pub(crate) const FILL_BLOCKS: u64 = 4 * SMS;

/// `bytes` rounded up to 256: the start of the next region of a workspace laid out in
/// regions, each aligned for any element type and for cuBLASLt's operands.
pub(crate) fn region(bytes: u64) -> u64 {
    bytes.div_ceil(256) * 256
}

/// `elements` rounded up to 8: a padded row stride, so that every row of a workspace matrix
/// starts 16-byte aligned in fp32 and in 16-bit types (what cuBLASLt's fast kernels need).
pub(crate) fn padded_row(elements: u64) -> u64 {
    elements.div_ceil(8) * 8
}

/// Splits `n` items into equal contiguous chunks, one a block, over `ceil(n / min_chunk)`
/// blocks but at most `max_blocks`: (blocks, items per chunk), both at least 1, every block
/// with at least one item when `n > 0`; only the last chunk may be shorter.
pub(crate) fn split(n: u64, min_chunk: u64, max_blocks: u64) -> (u64, u64) {
    let blocks = n.div_ceil(min_chunk.max(1)).clamp(1, max_blocks.max(1));
    let chunk = n.div_ceil(blocks).max(1);
    (n.div_ceil(chunk).max(1), chunk)
}

/// Most elements of a reduction group one block takes unsplit; a larger group splits into
/// slices of at most this many when the groups are too few to fill an H100.
pub(crate) const SLICE_ELEMENTS: u64 = 1024;

/// The slices (count, elements each but the last) each of `groups` reduction groups of
/// `gsize` elements is split into: one (the whole group) when the groups alone fill an
/// H100's [`SMS`]; otherwise one per [`SLICE_ELEMENTS`] elements (rounded up), but at most
/// about [`FILL_BLOCKS`] in all; every slice holds at least one element. A grid of `groups`
/// times the count is at least `SMS` blocks whenever the groups hold over
/// `SMS * SLICE_ELEMENTS` elements.
pub(crate) fn slices(groups: u64, gsize: u64) -> (u64, u64) {
    if groups >= SMS {
        return (1, gsize);
    }
    split(gsize, SLICE_ELEMENTS, FILL_BLOCKS.div_ceil(groups.max(1)))
}

/// Workspace bytes of a reduction over `groups` groups of `gsize` elements: `per_slice`
/// bytes for each slice where [`slices`] splits them, none where it does not.
pub(crate) fn slices_workspace(groups: u64, gsize: u64, per_slice: u64) -> u64 {
    match slices(groups, gsize) {
        (1, _) => 0,
        (n, _) => groups * n * per_slice,
    }
}

/// Reduction geometry of `x` onto the dims where `keep` is true: OUT/OST map an output
/// index to its group base, RSH/RST walk the group. Returns (lines, groups, group size).
pub(crate) fn reduce_cfg(x: &[usize], keep: &[bool]) -> (Vec<String>, u64, u64) {
    let xs = contiguous(x);
    let out: Vec<u64> = x
        .iter()
        .zip(keep)
        .map(|(&d, &k)| if k { u(d) } else { 1 })
        .collect();
    let ost: Vec<u64> = xs
        .iter()
        .zip(keep)
        .map(|(&s, &k)| if k { s } else { 0 })
        .collect();
    let rsh: Vec<u64> = x
        .iter()
        .zip(keep)
        .filter(|(_, &k)| !k)
        .map(|(&d, _)| u(d))
        .collect();
    let rst: Vec<u64> = xs
        .iter()
        .zip(keep)
        .filter(|(_, &k)| !k)
        .map(|(&s, _)| s)
        .collect();
    let (n, r) = (out.iter().product::<u64>(), rsh.iter().product::<u64>());
    let lines = vec![
        c_u64("N", n),
        c_u64("R", r),
        c_dims("OUT", &out),
        c_dims("OST", &ost),
        c_dims("RSH", &rsh),
        c_dims("RST", &rst),
    ];
    (lines, n, r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_gives_every_block_work_and_covers_every_item() {
        assert_eq!(split(0, 8, 4), (1, 1));
        assert_eq!(split(3111, 2048, 1056), (2, 1556));
        // Four blocks of 3 would leave the last empty: three blocks.
        assert_eq!(split(9, 1, 4), (3, 3));
        assert_eq!(split(10, 1, 4), (4, 3));
        for (n, min, most) in [(1, 1, 1), (1000, 7, 30), (8192, 1, 264), (5, 100, 9)] {
            let (blocks, chunk) = split(n, min, most);
            assert!(blocks <= most && blocks * chunk >= n && (blocks - 1) * chunk < n);
        }
    }
}
