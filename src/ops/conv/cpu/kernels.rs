//! 2-D convolution (grouped, strided, padded, dilated) through tiled im2col and GEMM: the
//! forward and the input and weight backwards. Work is split only over independent planes and
//! every sum runs in a fixed order, so results are bitwise identical from run to run.

use crate::exec::kernels::gemm::{gemm, rm, rm_mut, rm_t, MatMut, MatRef};
use crate::exec::kernels::layout::{out_len, par_chunks};

/// Input coordinate read by output `o` at kernel tap `t`, if it is inside `[0, size)`.
fn tap(o: usize, t: usize, stride: usize, pad: usize, dil: usize, size: usize) -> Option<usize> {
    (o * stride + t * dil)
        .checked_sub(pad)
        .filter(|&i| i < size)
}

/// Geometry of a 2-D convolution, NCHW input `[n, c_in, h, w]`, weight
/// `[c_out, c_in/groups, kh, kw]`, output `[n, c_out, h_out, w_out]`, as in
/// `torch.nn.functional.conv2d` (zero padding).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Conv2dGeom {
    /// Batch size.
    pub n: usize,
    /// Input channels.
    pub c_in: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Output channels.
    pub c_out: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Stride (height, width).
    pub stride: [usize; 2],
    /// Zero padding on each side (height, width).
    pub padding: [usize; 2],
    /// Dilation (height, width).
    pub dilation: [usize; 2],
    /// Number of channel groups; divides both `c_in` and `c_out`.
    pub groups: usize,
}

impl Conv2dGeom {
    /// Output height: `(h + 2p - d(kh-1) - 1) / s + 1`, or 0 if the kernel does not fit.
    pub fn h_out(&self) -> usize {
        out_len(
            self.h,
            self.kh,
            self.stride[0],
            self.padding[0],
            self.dilation[0],
        )
    }

    /// Output width: `(w + 2p - d(kw-1) - 1) / s + 1`, or 0 if the kernel does not fit.
    pub fn w_out(&self) -> usize {
        out_len(
            self.w,
            self.kw,
            self.stride[1],
            self.padding[1],
            self.dilation[1],
        )
    }

    /// A 1x1, stride-1, unpadded convolution is a plain GEMM on the input image (no im2col).
    fn pointwise(&self) -> bool {
        self.kh == 1 && self.kw == 1 && self.stride == [1, 1] && self.padding == [0, 0]
    }

    /// (output pixels, GEMM depth per group, output channels per group).
    fn dims(&self) -> (usize, usize, usize) {
        let g = self.groups.max(1);
        (
            self.h_out() * self.w_out(),
            self.c_in / g * self.kh * self.kw,
            self.c_out / g,
        )
    }

    /// Rows of the im2col matrix: `c_in * kh * kw` taps per output pixel.
    fn taps(&self) -> usize {
        self.c_in * self.kh * self.kw
    }

    /// Output pixels (im2col columns) per tile: as many as fit [`COL_TILE_ELEMS`], at least 1.
    fn tile(&self) -> usize {
        let l = self.h_out() * self.w_out();
        (COL_TILE_ELEMS / self.taps().max(1)).clamp(1, l.max(1))
    }

    /// The tiles `(first, end)` of the output pixels `0..h_out*w_out`, in order: one tile
    /// of every pixel for a pointwise convolution (its GEMM reads the image itself).
    fn column_tiles(&self) -> Vec<(usize, usize)> {
        let l = self.h_out() * self.w_out();
        let t = if self.pointwise() {
            l.max(1)
        } else {
            self.tile()
        };
        (0..l).step_by(t).map(|c0| (c0, (c0 + t).min(l))).collect()
    }

    /// Visits every in-bounds (index within one channel's rows of the im2col tile of output
    /// pixels `c0..c1`, input index within one plane) pair, in a fixed order.
    fn for_each_tap(&self, (c0, c1): (usize, usize), mut f: impl FnMut(usize, usize)) {
        let wo = self.w_out();
        let (s, p, d) = (self.stride, self.padding, self.dilation);
        let len = c1 - c0;
        for ki in 0..self.kh {
            for kj in 0..self.kw {
                let row = (ki * self.kw + kj) * len;
                for col in c0..c1 {
                    let (oh, ow) = (col / wo, col % wo);
                    let ih = tap(oh, ki, s[0], p[0], d[0], self.h);
                    let iw = tap(ow, kj, s[1], p[1], d[1], self.w);
                    if let (Some(ih), Some(iw)) = (ih, iw) {
                        f(row + col - c0, ih * self.w + iw);
                    }
                }
            }
        }
    }
}

/// Most f32 elements of an im2col tile: the conv kernels build the im2col matrix of one
/// image a tile of output pixels at a time, so their scratch stays within 1 MiB (or one
/// column of taps, if larger) however large the image.
const COL_TILE_ELEMS: usize = 1 << 18;

/// f32 elements of scratch the conv kernels need: one im2col tile (`c_in*kh*kw` rows by
/// [`Conv2dGeom::tile`] output pixels), or 0 for a 1x1 stride-1 unpadded convolution.
pub fn conv2d_workspace_len(g: &Conv2dGeom) -> usize {
    if g.pointwise() {
        0
    } else {
        g.taps() * g.tile()
    }
}

/// Writes the im2col tile `[c_in*kh*kw, c1-c0]` of output pixels `c0..c1` of one image
/// `[c_in, h, w]` into `col`.
fn im2col(g: &Conv2dGeom, img: &[f32], cols: (usize, usize), col: &mut [f32]) {
    let (plane, rows) = (g.h * g.w, g.kh * g.kw * (cols.1 - cols.0));
    par_chunks(&mut col[..g.c_in * rows], rows, |cc, c| {
        let xc = &img[c * plane..(c + 1) * plane];
        cc.fill(0.0);
        g.for_each_tap(cols, |ci, xi| cc[ci] = xc[xi]);
    });
}

/// Adds to one image `[c_in, h, w]` the im2col tile entries of output pixels `c0..c1` mapping
/// to each pixel (the adjoint of `im2col`).
fn col2im_add(g: &Conv2dGeom, col: &[f32], cols: (usize, usize), img: &mut [f32]) {
    let (plane, rows) = (g.h * g.w, g.kh * g.kw * (cols.1 - cols.0));
    par_chunks(img, plane, |xc, c| {
        let cc = &col[c * rows..(c + 1) * rows];
        g.for_each_tap(cols, |ci, xi| xc[xi] += cc[ci]);
    });
}

/// The GEMM operand for output pixels `c0..c1` of image `img`: the image itself for
/// pointwise convolutions (one tile of every pixel), else its im2col tile written into
/// `workspace`.
fn columns<'a>(
    g: &Conv2dGeom,
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

/// Forward 2-D convolution: `out[n, co] = sum_ci w[co, ci] * x[n, ci]` (cross-correlation,
/// torch semantics). `workspace` has at least `conv2d_workspace_len(g)` elements; `out` is
/// fully overwritten.
pub fn conv2d_forward(
    g: &Conv2dGeom,
    x: &[f32],
    w: &[f32],
    out: &mut [f32],
    workspace: &mut [f32],
) {
    let (l, kg, cog) = g.dims();
    let (xs, os) = (g.c_in * g.h * g.w, g.c_out * l);
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

/// Gradient of a 2-D convolution w.r.t. its input: `dx = conv^T(dy, w)`, written over `dx`
/// (`[n, c_in, h, w]`). `workspace` has at least `conv2d_workspace_len(g)` elements.
pub fn conv2d_backward_input(
    g: &Conv2dGeom,
    dy: &[f32],
    w: &[f32],
    dx: &mut [f32],
    workspace: &mut [f32],
) {
    let (l, kg, cog) = g.dims();
    let (xs, os) = (g.c_in * g.h * g.w, g.c_out * l);
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

/// Gradient of a 2-D convolution w.r.t. its weight: `dw = sum_n dy[n] * im2col(x[n])^T`,
/// accumulated over images and tiles in index order and written over `dw`. `workspace` has
/// at least `conv2d_workspace_len(g)` elements.
pub fn conv2d_backward_weight(
    g: &Conv2dGeom,
    x: &[f32],
    dy: &[f32],
    dw: &mut [f32],
    workspace: &mut [f32],
) {
    let (l, kg, cog) = g.dims();
    let (xs, os) = (g.c_in * g.h * g.w, g.c_out * l);
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

    fn naive_conv(g: &Conv2dGeom, x: &[f32], w: &[f32]) -> Vec<f32> {
        let (ho, wo) = (g.h_out(), g.w_out());
        let (cig, cog) = (g.c_in / g.groups, g.c_out / g.groups);
        let mut out = vec![0.0; g.n * g.c_out * ho * wo];
        for n in 0..g.n {
            for co in 0..g.c_out {
                let grp = co / cog;
                for oh in 0..ho {
                    for ow in 0..wo {
                        let mut s = 0.0f64;
                        for ci in 0..cig {
                            for ki in 0..g.kh {
                                for kj in 0..g.kw {
                                    let ih = (oh * g.stride[0] + ki * g.dilation[0]) as isize
                                        - g.padding[0] as isize;
                                    let iw = (ow * g.stride[1] + kj * g.dilation[1]) as isize
                                        - g.padding[1] as isize;
                                    if ih < 0 || iw < 0 || ih >= g.h as isize || iw >= g.w as isize
                                    {
                                        continue;
                                    }
                                    let c = grp * cig + ci;
                                    let xv = x[((n * g.c_in + c) * g.h + ih as usize) * g.w
                                        + iw as usize];
                                    let wv = w[((co * cig + ci) * g.kh + ki) * g.kw + kj];
                                    s += xv as f64 * wv as f64;
                                }
                            }
                        }
                        out[((n * g.c_out + co) * ho + oh) * wo + ow] = s as f32;
                    }
                }
            }
        }
        out
    }

    fn conv_geoms() -> [Conv2dGeom; 3] {
        let base = Conv2dGeom {
            n: 2,
            c_in: 4,
            h: 7,
            w: 6,
            c_out: 6,
            kh: 3,
            kw: 2,
            stride: [2, 2],
            padding: [1, 1],
            dilation: [2, 2],
            groups: 2,
        };
        let pointwise = Conv2dGeom {
            kh: 1,
            kw: 1,
            stride: [1, 1],
            padding: [0, 0],
            ..base
        };
        let plain = Conv2dGeom {
            stride: [1, 2],
            padding: [0, 1],
            dilation: [1, 1],
            groups: 1,
            ..base
        };
        [base, pointwise, plain]
    }

    fn conv_fwd(g: &Conv2dGeom, x: &[f32], w: &[f32]) -> Vec<f32> {
        let mut out = vec![f32::NAN; g.n * g.c_out * g.h_out() * g.w_out()];
        let mut ws = vec![f32::NAN; conv2d_workspace_len(g)];
        conv2d_forward(g, x, w, &mut out, &mut ws);
        out
    }

    #[test]
    fn conv_forward_matches_naive() {
        let mut rng = Rng(7);
        for g in conv_geoms() {
            let x = rng.vec(g.n * g.c_in * g.h * g.w);
            let w = rng.vec(g.c_out * g.c_in / g.groups * g.kh * g.kw);
            assert_close(
                &conv_fwd(&g, &x, &w),
                &naive_conv(&g, &x, &w),
                1e-5,
                &format!("{g:?}"),
            );
        }
        assert_eq!((conv_geoms()[0].h_out(), conv_geoms()[0].w_out()), (3, 3));
    }

    #[test]
    fn conv_backward_matches_finite_differences() {
        let mut rng = Rng(11);
        for g in conv_geoms() {
            let x = rng.vec(g.n * g.c_in * g.h * g.w);
            let w = rng.vec(g.c_out * g.c_in / g.groups * g.kh * g.kw);
            let r = rng.vec(g.n * g.c_out * g.h_out() * g.w_out());
            let mut ws = vec![f32::NAN; conv2d_workspace_len(&g)];
            let mut dx = vec![f32::NAN; x.len()];
            conv2d_backward_input(&g, &r, &w, &mut dx, &mut ws);
            let want = central_diff(&x, 1e-2, |x| dot(&conv_fwd(&g, x, &w), &r));
            assert_close(&dx, &want, 1e-2, "conv dx");
            let mut dw = vec![f32::NAN; w.len()];
            conv2d_backward_weight(&g, &x, &r, &mut dw, &mut ws);
            let want = central_diff(&w, 1e-2, |w| dot(&conv_fwd(&g, &x, w), &r));
            assert_close(&dw, &want, 1e-2, "conv dw");
        }
    }

    /// A convolution whose im2col matrix spans several tiles: forward against the naive
    /// loop, backward by the adjoint identities `<conv(x, w), r> = <x, dx(r)> = <w, dw(x, r)>`.
    #[test]
    fn tiled_conv_matches_naive_and_its_adjoints() {
        let g = Conv2dGeom {
            n: 2,
            c_in: 2,
            h: 130,
            w: 131,
            c_out: 4,
            kh: 3,
            kw: 3,
            stride: [1, 1],
            padding: [1, 1],
            dilation: [1, 1],
            groups: 2,
        };
        let l = g.h_out() * g.w_out();
        assert!(g.column_tiles().len() > 1, "{} pixels in one tile", l);
        assert_eq!(conv2d_workspace_len(&g), g.taps() * g.tile());
        let mut rng = Rng(5);
        let x = rng.vec(g.n * g.c_in * g.h * g.w);
        let w = rng.vec(g.c_out * g.c_in / g.groups * g.kh * g.kw);
        let r = rng.vec(g.n * g.c_out * l);
        let y = conv_fwd(&g, &x, &w);
        assert_close(&y, &naive_conv(&g, &x, &w), 1e-5, "tiled forward");
        let mut ws = vec![f32::NAN; conv2d_workspace_len(&g)];
        let mut dx = vec![f32::NAN; x.len()];
        conv2d_backward_input(&g, &r, &w, &mut dx, &mut ws);
        let mut dw = vec![f32::NAN; w.len()];
        conv2d_backward_weight(&g, &x, &r, &mut dw, &mut ws);
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
