//! N-d convolution (grouped, strided, padded, dilated; 1-D and 2-D as 3-D with unit leading
//! extents) through tiled im2col and GEMM: the forward and the input and weight backwards.
//! Work is split only over independent planes and every sum runs in a fixed order, so results
//! are bitwise identical from run to run.

use crate::exec::kernels::gemm::{gemm, rm, rm_mut, rm_t, MatMut, MatRef};
use crate::exec::kernels::layout::par_chunks;
use crate::ops::conv::{Geom, SPATIAL};

/// Input coordinate read by output `o` at kernel tap `t`, if it is inside `[0, size)`.
fn tap(o: usize, t: usize, stride: usize, pad: usize, dil: usize, size: usize) -> Option<usize> {
    (o * stride + t * dil)
        .checked_sub(pad)
        .filter(|&i| i < size)
}

impl Geom {
    /// Output positions per image: the product of the output extents.
    fn out_len(&self) -> usize {
        self.out().iter().product()
    }

    /// Input positions per channel plane: the product of the input extents.
    fn plane(&self) -> usize {
        self.size.iter().product()
    }

    /// A 1x1(x1), stride-1, unpadded convolution is a plain GEMM on the input image (no
    /// im2col).
    fn pointwise(&self) -> bool {
        self.kernel == [1; SPATIAL] && self.stride == [1; SPATIAL] && self.padding == [0; SPATIAL]
    }

    /// (output positions, GEMM depth per group, output channels per group).
    fn dims(&self) -> (usize, usize, usize) {
        let g = self.groups.max(1);
        (
            self.out_len(),
            self.c_in / g * self.taps_per_channel(),
            self.c_out / g,
        )
    }

    /// Kernel taps per input channel: the product of the kernel extents.
    fn taps_per_channel(&self) -> usize {
        self.kernel.iter().product()
    }

    /// Rows of the im2col matrix: `c_in * prod(kernel)` taps per output position.
    fn taps(&self) -> usize {
        self.c_in * self.taps_per_channel()
    }

    /// Output positions (im2col columns) per tile: as many as fit [`COL_TILE_ELEMS`], at
    /// least 1.
    fn tile(&self) -> usize {
        (COL_TILE_ELEMS / self.taps().max(1)).clamp(1, self.out_len().max(1))
    }

    /// The tiles `(first, end)` of the output positions, in order: one tile of every
    /// position for a pointwise convolution (its GEMM reads the image itself).
    fn column_tiles(&self) -> Vec<(usize, usize)> {
        let l = self.out_len();
        let t = if self.pointwise() {
            l.max(1)
        } else {
            self.tile()
        };
        (0..l).step_by(t).map(|c0| (c0, (c0 + t).min(l))).collect()
    }

    /// Visits every in-bounds (index within one channel's rows of the im2col tile of output
    /// positions `c0..c1`, input index within one plane) pair, in a fixed order.
    fn for_each_tap(&self, (c0, c1): (usize, usize), mut f: impl FnMut(usize, usize)) {
        let o = self.out();
        let (n, k) = (self.size, self.kernel);
        let (s, p, d) = (self.stride, self.padding, self.dilation);
        let len = c1 - c0;
        let at = |axis: usize, o: usize, t: usize| tap(o, t, s[axis], p[axis], d[axis], n[axis]);
        for kd in 0..k[0] {
            for kh in 0..k[1] {
                for kw in 0..k[2] {
                    let row = ((kd * k[1] + kh) * k[2] + kw) * len;
                    for col in c0..c1 {
                        let (od, oh, ow) = (col / (o[1] * o[2]), (col / o[2]) % o[1], col % o[2]);
                        if let (Some(id), Some(ih), Some(iw)) =
                            (at(0, od, kd), at(1, oh, kh), at(2, ow, kw))
                        {
                            f(row + col - c0, (id * n[1] + ih) * n[2] + iw);
                        }
                    }
                }
            }
        }
    }
}

/// Most f32 elements of an im2col tile: the conv kernels build the im2col matrix of one
/// image a tile of output positions at a time, so their scratch stays within 1 MiB (or one
/// column of taps, if larger) however large the image.
const COL_TILE_ELEMS: usize = 1 << 18;

/// f32 elements of scratch the conv kernels need: one im2col tile (`c_in*prod(kernel)` rows
/// by [`Geom::tile`] output positions), or 0 for a 1x1 stride-1 unpadded convolution.
pub fn workspace_len(g: &Geom) -> usize {
    if g.pointwise() {
        0
    } else {
        g.taps() * g.tile()
    }
}

/// Writes the im2col tile `[c_in*prod(kernel), c1-c0]` of output positions `c0..c1` of one
/// image `[c_in, d, h, w]` into `col`.
fn im2col(g: &Geom, img: &[f32], cols: (usize, usize), col: &mut [f32]) {
    let (plane, rows) = (g.plane(), g.taps_per_channel() * (cols.1 - cols.0));
    par_chunks(&mut col[..g.c_in * rows], rows, |cc, c| {
        let xc = &img[c * plane..(c + 1) * plane];
        cc.fill(0.0);
        g.for_each_tap(cols, |ci, xi| cc[ci] = xc[xi]);
    });
}

/// Adds to one image `[c_in, d, h, w]` the im2col tile entries of output positions `c0..c1`
/// mapping to each position (the adjoint of `im2col`).
fn col2im_add(g: &Geom, col: &[f32], cols: (usize, usize), img: &mut [f32]) {
    let (plane, rows) = (g.plane(), g.taps_per_channel() * (cols.1 - cols.0));
    par_chunks(img, plane, |xc, c| {
        let cc = &col[c * rows..(c + 1) * rows];
        g.for_each_tap(cols, |ci, xi| xc[xi] += cc[ci]);
    });
}

/// The GEMM operand for output positions `c0..c1` of image `img`: the image itself for
/// pointwise convolutions (one tile of every position), else its im2col tile written into
/// `workspace`.
fn columns<'a>(
    g: &Geom,
    img: &'a [f32],
    cols: (usize, usize),
    workspace: &'a mut [f32],
) -> &'a [f32] {
    if g.pointwise() {
        img
    } else {
        im2col(g, img, cols, workspace);
        &workspace[..g.taps() * (cols.1 - cols.0)]
    }
}

/// The columns `c0..` of a row-major matrix with `cols` columns, starting at row `row`.
fn cols_from(data: &[f32], cols: usize, row: usize, c0: usize) -> MatRef<'_> {
    rm(&data[row * cols + c0..], cols)
}

/// Forward N-d convolution: `out[n, co] = sum_ci w[co, ci] * x[n, ci]` (cross-correlation,
/// torch semantics). `workspace` has at least `workspace_len(g)` elements; `out` is
/// fully overwritten.
pub fn forward(g: &Geom, x: &[f32], w: &[f32], out: &mut [f32], workspace: &mut [f32]) {
    let (l, kg, cog) = g.dims();
    let (xs, os) = (g.c_in * g.plane(), g.c_out * l);
    for i in 0..g.n {
        let img = &x[i * xs..(i + 1) * xs];
        let o_img = &mut out[i * os..(i + 1) * os];
        for (c0, c1) in g.column_tiles() {
            let len = c1 - c0;
            let col = columns(g, img, (c0, c1), workspace);
            for grp in 0..g.groups {
                let wg = rm(&w[grp * cog * kg..(grp + 1) * cog * kg], kg);
                let cg = rm(&col[grp * kg * len..(grp + 1) * kg * len], len);
                let o = MatMut {
                    data: &mut o_img[grp * cog * l + c0..],
                    rs: l,
                    cs: 1,
                };
                gemm(cog, kg, len, wg, cg, 0.0, o);
            }
        }
    }
}

/// Gradient of a convolution w.r.t. its input: `dx = conv^T(dy, w)`, written over `dx`
/// (`[n, c_in, d, h, w]`; also the transposed convolution). `workspace` has at least
/// `workspace_len(g)` elements.
pub fn backward_input(g: &Geom, dy: &[f32], w: &[f32], dx: &mut [f32], workspace: &mut [f32]) {
    let (l, kg, cog) = g.dims();
    let (xs, os) = (g.c_in * g.plane(), g.c_out * l);
    for i in 0..g.n {
        let dy_img = &dy[i * os..(i + 1) * os];
        let dx_img = &mut dx[i * xs..(i + 1) * xs];
        if g.pointwise() {
            for grp in 0..g.groups {
                let wg = rm_t(&w[grp * cog * kg..(grp + 1) * cog * kg], kg);
                let dyg = cols_from(dy_img, l, grp * cog, 0);
                let dxg = rm_mut(&mut dx_img[grp * kg * l..(grp + 1) * kg * l], l);
                gemm(kg, cog, l, wg, dyg, 0.0, dxg);
            }
            continue;
        }
        dx_img.fill(0.0);
        for (c0, c1) in g.column_tiles() {
            let len = c1 - c0;
            let col = &mut workspace[..g.taps() * len];
            for grp in 0..g.groups {
                let wg = rm_t(&w[grp * cog * kg..(grp + 1) * cog * kg], kg);
                let dyg = cols_from(dy_img, l, grp * cog, c0);
                let cg = rm_mut(&mut col[grp * kg * len..(grp + 1) * kg * len], len);
                gemm(kg, cog, len, wg, dyg, 0.0, cg);
            }
            col2im_add(g, col, (c0, c1), dx_img);
        }
    }
}

/// Gradient of a convolution w.r.t. its weight: `dw = sum_n dy[n] * im2col(x[n])^T`,
/// accumulated over images and tiles in index order and written over `dw`. `workspace` has
/// at least `workspace_len(g)` elements.
pub fn backward_weight(g: &Geom, x: &[f32], dy: &[f32], dw: &mut [f32], workspace: &mut [f32]) {
    let (l, kg, cog) = g.dims();
    let (xs, os) = (g.c_in * g.plane(), g.c_out * l);
    dw.fill(0.0);
    for i in 0..g.n {
        let img = &x[i * xs..(i + 1) * xs];
        let dy_img = &dy[i * os..(i + 1) * os];
        for (c0, c1) in g.column_tiles() {
            let len = c1 - c0;
            let col = columns(g, img, (c0, c1), workspace);
            for grp in 0..g.groups {
                let dyg = cols_from(dy_img, l, grp * cog, c0);
                let cg = rm_t(&col[grp * kg * len..(grp + 1) * kg * len], len);
                let dwg = rm_mut(&mut dw[grp * cog * kg..(grp + 1) * cog * kg], kg);
                gemm(cog, len, kg, dyg, cg, 1.0, dwg);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! Forward kernels are checked against naive references; backward kernels against central
    //! finite differences of `sum(forward(x) * r)` (f64 loss accumulation, eps 1e-2), with
    //! relative L2 error below 1e-2.
    use super::*;
    use crate::exec::kernels::testing::{assert_close, central_diff, dot, Rng};

    /// The input coordinate along `axis` read by output `o` at tap `t`, if inside.
    fn naive_tap(g: &Geom, axis: usize, o: usize, t: usize) -> Option<usize> {
        tap(
            o,
            t,
            g.stride[axis],
            g.padding[axis],
            g.dilation[axis],
            g.size[axis],
        )
    }

    fn naive_conv(g: &Geom, x: &[f32], w: &[f32]) -> Vec<f32> {
        let (o, n, k) = (g.out(), g.size, g.kernel);
        let (cig, cog) = (g.c_in / g.groups, g.c_out / g.groups);
        let mut out = vec![0.0; g.n * g.c_out * g.out_len()];
        for (idx, y) in out.iter_mut().enumerate() {
            let (ow, oh, od) = (idx % o[2], idx / o[2] % o[1], idx / (o[1] * o[2]) % o[0]);
            let (co, b) = (idx / g.out_len() % g.c_out, idx / (g.out_len() * g.c_out));
            let mut s = 0.0f64;
            for ci in 0..cig {
                let c = co / cog * cig + ci;
                for t in 0..g.taps_per_channel() {
                    let (tw, th, td) = (t % k[2], t / k[2] % k[1], t / (k[1] * k[2]));
                    let taps = (naive_tap(g, 0, od, td), naive_tap(g, 1, oh, th));
                    let (Some(id), Some(ih)) = taps else { continue };
                    let Some(iw) = naive_tap(g, 2, ow, tw) else {
                        continue;
                    };
                    let xv = x[(((b * g.c_in + c) * n[0] + id) * n[1] + ih) * n[2] + iw];
                    let wv = w[(co * cig + ci) * g.taps_per_channel() + t];
                    s += xv as f64 * wv as f64;
                }
            }
            *y = s as f32;
        }
        out
    }

    fn geom(spatial: [usize; 3], kernel: [usize; 3], lists: [[usize; 3]; 3]) -> Geom {
        Geom {
            n: 2,
            c_in: 4,
            c_out: 6,
            groups: 2,
            size: spatial,
            kernel,
            stride: lists[0],
            padding: lists[1],
            dilation: lists[2],
        }
    }

    /// Grouped, strided, padded, dilated 2-D; pointwise; plain; 3-D; 1-D.
    fn conv_geoms() -> [Geom; 5] {
        let base = geom([1, 7, 6], [1, 3, 2], [[1, 2, 2], [0, 1, 1], [1, 2, 2]]);
        let pointwise = geom([1, 7, 6], [1; 3], [[1; 3], [0; 3], [1; 3]]);
        let plain = Geom {
            groups: 1,
            ..geom([1, 7, 6], [1, 3, 2], [[1, 1, 2], [0, 0, 1], [1; 3]])
        };
        let volume = geom([5, 4, 6], [3, 2, 3], [[2, 1, 2], [1, 0, 1], [1, 2, 1]]);
        let line = geom([1, 1, 9], [1, 1, 3], [[1, 1, 2], [0, 0, 2], [1, 1, 2]]);
        [base, pointwise, plain, volume, line]
    }

    fn conv_fwd(g: &Geom, x: &[f32], w: &[f32]) -> Vec<f32> {
        let mut out = vec![f32::NAN; g.n * g.c_out * g.out_len()];
        let mut ws = vec![f32::NAN; workspace_len(g)];
        forward(g, x, w, &mut out, &mut ws);
        out
    }

    fn operands(g: &Geom, rng: &mut Rng) -> (Vec<f32>, Vec<f32>) {
        let x = rng.vec(g.n * g.c_in * g.plane());
        let w = rng.vec(g.c_out * g.c_in / g.groups * g.taps_per_channel());
        (x, w)
    }

    #[test]
    fn conv_forward_matches_naive() {
        let mut rng = Rng(7);
        for g in conv_geoms() {
            let (x, w) = operands(&g, &mut rng);
            assert_close(
                &conv_fwd(&g, &x, &w),
                &naive_conv(&g, &x, &w),
                1e-5,
                &format!("{g:?}"),
            );
        }
        let outs = conv_geoms().map(|g| g.out());
        assert_eq!(outs[0], [1, 3, 3]);
        assert_eq!(outs[3], [3, 2, 3]);
        assert_eq!(outs[4], [1, 1, 5]);
    }

    #[test]
    fn conv_backward_matches_finite_differences() {
        let mut rng = Rng(11);
        for g in conv_geoms() {
            let (x, w) = operands(&g, &mut rng);
            let r = rng.vec(g.n * g.c_out * g.out_len());
            let mut ws = vec![f32::NAN; workspace_len(&g)];
            let mut dx = vec![f32::NAN; x.len()];
            backward_input(&g, &r, &w, &mut dx, &mut ws);
            let want = central_diff(&x, 1e-2, |x| dot(&conv_fwd(&g, x, &w), &r));
            assert_close(&dx, &want, 1e-2, &format!("conv dx {g:?}"));
            let mut dw = vec![f32::NAN; w.len()];
            backward_weight(&g, &x, &r, &mut dw, &mut ws);
            let want = central_diff(&w, 1e-2, |w| dot(&conv_fwd(&g, &x, w), &r));
            assert_close(&dw, &want, 1e-2, &format!("conv dw {g:?}"));
        }
    }

    /// Convolutions whose im2col matrix spans several tiles (a 2-D image and a 3-D volume):
    /// forward against the naive loop, backward by the adjoint identities
    /// `<conv(x, w), r> = <x, dx(r)> = <w, dw(x, r)>`.
    #[test]
    fn tiled_conv_matches_naive_and_its_adjoints() {
        let image = Geom {
            c_in: 2,
            c_out: 4,
            ..geom([1, 130, 131], [1, 3, 3], [[1; 3], [0, 1, 1], [1; 3]])
        };
        let volume = Geom {
            c_in: 2,
            c_out: 4,
            ..geom([40, 40, 41], [3, 3, 3], [[1; 3], [1; 3], [1; 3]])
        };
        for g in [image, volume] {
            let l = g.out_len();
            assert!(g.column_tiles().len() > 1, "{l} positions in one tile");
            assert_eq!(workspace_len(&g), g.taps() * g.tile());
            assert!(workspace_len(&g) <= COL_TILE_ELEMS);
            let mut rng = Rng(5);
            let (x, w) = operands(&g, &mut rng);
            let r = rng.vec(g.n * g.c_out * l);
            let y = conv_fwd(&g, &x, &w);
            assert_close(&y, &naive_conv(&g, &x, &w), 1e-5, "tiled forward");
            let mut ws = vec![f32::NAN; workspace_len(&g)];
            let mut dx = vec![f32::NAN; x.len()];
            backward_input(&g, &r, &w, &mut dx, &mut ws);
            let mut dw = vec![f32::NAN; w.len()];
            backward_weight(&g, &x, &r, &mut dw, &mut ws);
            let (yr, xdx, wdw) = (dot(&y, &r), dot(&x, &dx), dot(&w, &dw));
            assert!(
                (yr - xdx).abs() <= 1e-4 * yr.abs().max(1.0),
                "dx: {yr} vs {xdx}"
            );
            assert!(
                (yr - wdw).abs() <= 1e-4 * yr.abs().max(1.0),
                "dw: {yr} vs {wdw}"
            );
        }
    }
}
