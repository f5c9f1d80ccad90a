//! Dense CPU kernels: batched matmul, 2-D convolution and pooling, attention and rotary embedding.
//!
//! Every kernel reads contiguous row-major `f32` slices and fully overwrites its output. Work is
//! split only over independent output rows/planes, and every float sum runs in a fixed order,
//! so results are bitwise identical from run to run.

use rayon::prelude::*;

// ---------------------------------------------------------------------------------------------
// GEMM wrapper
// ---------------------------------------------------------------------------------------------

/// A read-only strided matrix view: element (i, j) is `data[i * rs + j * cs]`.
#[derive(Clone, Copy)]
struct MatRef<'a> {
    data: &'a [f32],
    rs: usize,
    cs: usize,
}

/// A writable strided matrix view: element (i, j) is `data[i * rs + j * cs]`.
struct MatMut<'a> {
    data: &'a mut [f32],
    rs: usize,
    cs: usize,
}

/// Row-major view of a contiguous matrix with `cols` columns.
fn rm(data: &[f32], cols: usize) -> MatRef<'_> {
    MatRef {
        data,
        rs: cols,
        cs: 1,
    }
}

/// Row-major view of the transpose of a contiguous matrix with `cols` columns.
fn rm_t(data: &[f32], cols: usize) -> MatRef<'_> {
    MatRef {
        data,
        rs: 1,
        cs: cols,
    }
}

/// Row-major writable view of a contiguous matrix with `cols` columns.
fn rm_mut(data: &mut [f32], cols: usize) -> MatMut<'_> {
    MatMut {
        data,
        rs: cols,
        cs: 1,
    }
}

/// Number of elements a `rows x cols` view with strides `(rs, cs)` spans.
fn span(rows: usize, cols: usize, rs: usize, cs: usize) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        (rows - 1) * rs + (cols - 1) * cs + 1
    }
}

/// Computes `C = A B + beta C` for `A: m x k`, `B: k x n`, `C: m x n` with `matrixmultiply`.
/// With `beta == 0` the old contents of `C` are never read.
fn gemm(m: usize, k: usize, n: usize, a: MatRef, b: MatRef, beta: f32, c: MatMut) {
    // Soundness guard for the raw-pointer call below (cheap: O(1) per call).
    assert!(
        a.data.len() >= span(m, k, a.rs, a.cs)
            && b.data.len() >= span(k, n, b.rs, b.cs)
            && c.data.len() >= span(m, n, c.rs, c.cs),
        "gemm operand too short"
    );
    if m == 0 || n == 0 {
        return;
    }
    let st = |s: usize| s as isize;
    // SAFETY: the assert above guarantees every index the m x k, k x n and m x n views touch
    // lies inside the respective slice; C is exclusively borrowed and its strides (cs = 1 or
    // rs = 1 with the other >= the extent) never alias two elements.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.data.as_ptr(),
            st(a.rs),
            st(a.cs),
            b.data.as_ptr(),
            st(b.rs),
            st(b.cs),
            beta,
            c.data.as_mut_ptr(),
            st(c.rs),
            st(c.cs),
        );
    }
}

/// Index of the matrix that output batch `idx` reads from an operand with batch dims `x_batch`,
/// under numpy broadcasting against the output batch dims `o_batch`.
fn batch_offset(idx: usize, o_batch: &[usize], x_batch: &[usize]) -> usize {
    let (mut rem, mut off, mut stride) = (idx, 0, 1);
    for (d, &od) in o_batch.iter().enumerate().rev() {
        let i = rem % od;
        rem /= od;
        if let Some(xd) = (d + x_batch.len()).checked_sub(o_batch.len()) {
            let xs = x_batch[xd];
            if xs != 1 {
                off += i * stride;
            }
            stride *= xs;
        }
    }
    off
}

/// Below this `m*k + k*n`, matrixmultiply runs single-threaded, so batches go to rayon instead.
const GEMM_THREAD_SIZE: usize = 1 << 15;

/// Batched matmul with numpy broadcasting of the batch dims (all dims but the last two).
///
/// `a_shape`/`b_shape` have rank >= 2 and may differ in rank (missing leading dims are 1). If
/// `ta`, A is stored `[..., k, m]` and used transposed as `[..., m, k]`; likewise `tb` means B
/// is stored `[..., n, k]`. `out_shape = broadcast(batch_a, batch_b) ++ [m, n]`. Transposes are
/// handled through strides (no copies) and `out` is fully overwritten. When B has no batch and A
/// is neither broadcast nor transposed, the batch is folded into one large GEMM.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    a: &[f32],
    a_shape: &[usize],
    ta: bool,
    b: &[f32],
    b_shape: &[usize],
    tb: bool,
    out: &mut [f32],
    out_shape: &[usize],
) {
    let (ar, br, or) = (a_shape.len(), b_shape.len(), out_shape.len());
    debug_assert!(ar >= 2 && br >= 2 && or >= 2);
    let (m, k) = if ta {
        (a_shape[ar - 1], a_shape[ar - 2])
    } else {
        (a_shape[ar - 2], a_shape[ar - 1])
    };
    let n = if tb { b_shape[br - 2] } else { b_shape[br - 1] };
    debug_assert_eq!(&out_shape[or - 2..], &[m, n]);
    let (a_batch, b_batch, o_batch) =
        (&a_shape[..ar - 2], &b_shape[..br - 2], &out_shape[..or - 2]);
    let batches: usize = o_batch.iter().product();
    let (a_mat, b_mat, o_mat) = (m * k, k * n, m * n);
    let a_view = |d| if ta { rm_t(d, m) } else { rm(d, k) };
    let b_view = |d| if tb { rm_t(d, k) } else { rm(d, n) };
    if o_mat == 0 || batches == 0 {
        return;
    }
    if !ta && b_batch.iter().product::<usize>() == 1 && a_batch.iter().product::<usize>() == batches
    {
        gemm(batches * m, k, n, rm(a, k), b_view(b), 0.0, rm_mut(out, n));
        return;
    }
    let job = |(idx, o): (usize, &mut [f32])| {
        let ao = batch_offset(idx, o_batch, a_batch) * a_mat;
        let bo = batch_offset(idx, o_batch, b_batch) * b_mat;
        let (av, bv) = (a_view(&a[ao..ao + a_mat]), b_view(&b[bo..bo + b_mat]));
        gemm(m, k, n, av, bv, 0.0, rm_mut(o, n));
    };
    let out = &mut out[..batches * o_mat];
    if batches > 1 && m * k + k * n < GEMM_THREAD_SIZE {
        out.par_chunks_mut(o_mat).enumerate().for_each(job);
    } else {
        out.chunks_mut(o_mat).enumerate().for_each(job);
    }
}

// ---------------------------------------------------------------------------------------------
// Convolution
// ---------------------------------------------------------------------------------------------

/// Output length of a sliding window (floor mode, zero padding).
fn out_len(size: usize, k: usize, stride: usize, pad: usize, dil: usize) -> usize {
    let eff = dil * k.saturating_sub(1) + 1;
    let padded = size + 2 * pad;
    if k == 0 || padded < eff {
        0
    } else {
        (padded - eff) / stride + 1
    }
}

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

/// Runs `f(dst_chunk, i)` over the `dst.len() / chunk` consecutive chunks in parallel.
fn par_chunks(dst: &mut [f32], chunk: usize, f: impl Fn(&mut [f32], usize) + Sync + Send) {
    if chunk > 0 {
        dst.par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, d)| f(d, i));
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

// ---------------------------------------------------------------------------------------------
// Pooling
// ---------------------------------------------------------------------------------------------

/// Geometry of 2-D pooling over NCHW `[n, c, h, w] -> [n, c, h_out, w_out]` (torch semantics:
/// floor mode; avg pool counts padded zeros, i.e. `count_include_pad = true`; max pool ignores
/// padding).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pool2dGeom {
    /// Batch size.
    pub n: usize,
    /// Channels.
    pub c: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Window size (height, width).
    pub kernel: [usize; 2],
    /// Stride (height, width).
    pub stride: [usize; 2],
    /// Implicit padding on each side (height, width).
    pub padding: [usize; 2],
}

impl Pool2dGeom {
    /// Output height: `(h + 2p - k) / s + 1` (floor mode), or 0 if the window does not fit.
    pub fn h_out(&self) -> usize {
        out_len(self.h, self.kernel[0], self.stride[0], self.padding[0], 1)
    }

    /// Output width: `(w + 2p - k) / s + 1` (floor mode), or 0 if the window does not fit.
    pub fn w_out(&self) -> usize {
        out_len(self.w, self.kernel[1], self.stride[1], self.padding[1], 1)
    }

    /// Visits each output pixel of one plane with the in-bounds input indices of its window,
    /// in row-major order: `f(out_index, window)`.
    fn for_each_window(&self, mut f: impl FnMut(usize, &mut dyn Iterator<Item = usize>)) {
        let (ho, wo) = (self.h_out(), self.w_out());
        let (k, s, p) = (self.kernel, self.stride, self.padding);
        let range = |o: usize, d: usize, size: usize| {
            let start = (o * s[d]).saturating_sub(p[d]);
            let end = (o * s[d] + k[d]).saturating_sub(p[d]).min(size);
            start..end
        };
        for oh in 0..ho {
            let rows = range(oh, 0, self.h);
            for ow in 0..wo {
                let cols = range(ow, 1, self.w);
                let w = self.w;
                let mut win = rows
                    .clone()
                    .flat_map(|r| cols.clone().map(move |c| r * w + c));
                f(oh * wo + ow, &mut win);
            }
        }
    }

    /// Runs `f(dst_plane, a_plane, b_plane)` over all `n*c` planes in parallel.
    fn per_plane(
        &self,
        dst: &mut [f32],
        dst_plane: usize,
        a: (&[f32], usize),
        b: (&[f32], usize),
        f: impl Fn(&mut [f32], &[f32], &[f32]) + Sync + Send,
    ) {
        let planes = self.n * self.c;
        par_chunks(&mut dst[..planes * dst_plane], dst_plane, |d, i| {
            f(
                d,
                &a.0[i * a.1..(i + 1) * a.1],
                &b.0[i * b.1..(i + 1) * b.1],
            )
        });
    }
}

/// Index of the first maximal element of a window (a NaN wins, as in torch).
fn argmax(x: &[f32], win: &mut dyn Iterator<Item = usize>) -> Option<usize> {
    win.fold(None, |best: Option<usize>, i| match best {
        Some(b) if !(x[i] > x[b] || x[i].is_nan()) => Some(b),
        _ => Some(i),
    })
}

/// 2-D max pooling: each output is the maximum of the in-bounds elements of its window
/// (`-inf` for a window lying wholly in the padding).
pub fn max_pool2d_forward(g: &Pool2dGeom, x: &[f32], out: &mut [f32]) {
    let (plane, oplane) = (g.h * g.w, g.h_out() * g.w_out());
    g.per_plane(out, oplane, (x, plane), (x, plane), |o, xp, _| {
        g.for_each_window(|oi, win| o[oi] = argmax(xp, win).map_or(f32::NEG_INFINITY, |i| xp[i]));
    });
}

/// Gradient of 2-D max pooling: each `dy` goes to the first maximal element of its window
/// (row-major first), as torch does; overlapping windows add up. `dx` is fully overwritten.
pub fn max_pool2d_backward(g: &Pool2dGeom, x: &[f32], dy: &[f32], dx: &mut [f32]) {
    let (plane, oplane) = (g.h * g.w, g.h_out() * g.w_out());
    g.per_plane(dx, plane, (x, plane), (dy, oplane), |d, xp, dyp| {
        d.fill(0.0);
        g.for_each_window(|oi, win| {
            if let Some(i) = argmax(xp, win) {
                d[i] += dyp[oi];
            }
        });
    });
}

/// 2-D average pooling: each output is the sum of its window divided by `kernel[0]*kernel[1]`
/// (padded zeros count).
pub fn avg_pool2d_forward(g: &Pool2dGeom, x: &[f32], out: &mut [f32]) {
    let (plane, oplane) = (g.h * g.w, g.h_out() * g.w_out());
    let inv = 1.0 / (g.kernel[0] * g.kernel[1]) as f32;
    g.per_plane(out, oplane, (x, plane), (x, plane), |o, xp, _| {
        g.for_each_window(|oi, win| o[oi] = win.map(|i| xp[i]).sum::<f32>() * inv);
    });
}

/// Gradient of 2-D average pooling: each in-bounds element of a window receives
/// `dy / (kernel[0]*kernel[1])`; overlapping windows add up. `dx` is fully overwritten.
pub fn avg_pool2d_backward(g: &Pool2dGeom, dy: &[f32], dx: &mut [f32]) {
    let (plane, oplane) = (g.h * g.w, g.h_out() * g.w_out());
    let inv = 1.0 / (g.kernel[0] * g.kernel[1]) as f32;
    g.per_plane(dx, plane, (dy, oplane), (dy, oplane), |d, dyp, _| {
        d.fill(0.0);
        g.for_each_window(|oi, win| win.for_each(|i| d[i] += dyp[oi] * inv));
    });
}

// ---------------------------------------------------------------------------------------------
// Attention
// ---------------------------------------------------------------------------------------------

/// Multi-head scaled dot-product attention geometry. q: `[b, t_q, heads*head_dim]`, k and v:
/// `[b, t_k, kv_heads*head_dim]` (grouped-query: head h uses kv head `h / (heads/kv_heads)`),
/// out: `[b, t_q, heads*head_dim]`. `scale` multiplies q.k. If `causal`, query i attends keys
/// `j <= i + t_k - t_q`; a query with no visible key outputs zeros.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnGeom {
    /// Batch size.
    pub b: usize,
    /// Query length.
    pub t_q: usize,
    /// Key/value length.
    pub t_k: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads; divides `heads`.
    pub kv_heads: usize,
    /// Per-head feature size.
    pub head_dim: usize,
    /// Whether query i only sees keys `j <= i + t_k - t_q`.
    pub causal: bool,
    /// Factor applied to every q.k score.
    pub scale: f32,
}

impl AttnGeom {
    /// Number of keys query `i` attends (a prefix `0..n` of the keys).
    fn n_keys(&self, i: usize) -> usize {
        if !self.causal {
            return self.t_k;
        }
        let lim = i as isize + self.t_k as isize - self.t_q as isize + 1;
        lim.clamp(0, self.t_k as isize) as usize
    }

    /// Row widths of q/out and of k/v.
    fn widths(&self) -> (usize, usize) {
        (self.heads * self.head_dim, self.kv_heads * self.head_dim)
    }

    /// The kv head query head `h` reads.
    fn kv_of(&self, h: usize) -> usize {
        h / (self.heads / self.kv_heads.max(1)).max(1)
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
    /// `p.len()` visible keys into `p`.
    fn probs(&self, bi: usize, kvh: usize, qh: &[f32], p: &mut [f32]) {
        let (_, kvw) = self.g.widths();
        for (j, pj) in p.iter_mut().enumerate() {
            *pj = self.g.scale * dot(qh, self.g.head(self.k, bi * self.g.t_k + j, kvw, kvh));
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

    /// Turns probabilities `p` into score gradients `ds_j = p_j (dout.v_j - sum_l p_l dout.v_l)`
    /// in place, using `dp` as scratch of the same length.
    fn score_grads(&self, bi: usize, kvh: usize, dout_h: &[f32], p: &mut [f32], dp: &mut [f32]) {
        let (_, kvw) = self.g.widths();
        for (j, dpj) in dp.iter_mut().enumerate() {
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
    let rows = g.b * g.t_q;
    if qw == 0 || rows == 0 {
        return;
    }
    out[..rows * qw]
        .par_chunks_mut(qw)
        .enumerate()
        .for_each_init(
            || vec![0.0f32; g.t_k],
            |p, (row, o)| {
                let (bi, i) = (row / g.t_q, row % g.t_q);
                let p = &mut p[..g.n_keys(i)];
                for h in 0..g.heads {
                    let kvh = g.kv_of(h);
                    ctx.probs(bi, kvh, g.head(q, row, qw, h), p);
                    let oh = &mut o[h * g.head_dim..(h + 1) * g.head_dim];
                    oh.fill(0.0);
                    for (j, &pj) in p.iter().enumerate() {
                        axpy(pj, g.head(v, bi * g.t_k + j, kvw, kvh), oh);
                    }
                }
            },
        );
}

pub use crate::ir::AttnInput;

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
            let group = g.heads / g.kv_heads.max(1);
            (0..g.b * g.kv_heads).into_par_iter().for_each_init(
                || vec![0.0f32; 2 * g.t_k],
                |scratch, task| {
                    let (bi, kvh) = (task / g.kv_heads, task % g.kv_heads);
                    let (p, dp) = scratch.split_at_mut(g.t_k);
                    for h in kvh * group..(kvh + 1) * group {
                        for i in 0..g.t_q {
                            let row = bi * g.t_q + i;
                            let (qh, doh) = (g.head(q, row, qw, h), g.head(dout, row, qw, h));
                            let nk = g.n_keys(i);
                            let p = &mut p[..nk];
                            ctx.probs(bi, kvh, qh, p);
                            let (src, alpha) = if which == AttnInput::K {
                                ctx.score_grads(bi, kvh, doh, p, &mut dp[..nk]);
                                (qh, g.scale)
                            } else {
                                (doh, 1.0)
                            };
                            for (j, &pj) in p.iter().enumerate() {
                                let off = (bi * g.t_k + j) * kvw + kvh * g.head_dim;
                                // SAFETY: task (bi, kvh) is the only one touching the
                                // head_dim-long segments at batch bi, kv head kvh, and this
                                // slice is dropped before the next is made.
                                let seg = unsafe { out.segment(off, g.head_dim) };
                                axpy(alpha * pj, src, seg);
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
    let rows = g.b * g.t_q;
    if qw == 0 || rows == 0 {
        return;
    }
    dst[..rows * qw]
        .par_chunks_mut(qw)
        .enumerate()
        .for_each_init(
            || vec![0.0f32; 2 * g.t_k],
            |scratch, (row, d)| {
                let (bi, i) = (row / g.t_q, row % g.t_q);
                let nk = g.n_keys(i);
                let (p, dp) = scratch.split_at_mut(g.t_k);
                let (p, dp) = (&mut p[..nk], &mut dp[..nk]);
                for h in 0..g.heads {
                    let kvh = g.kv_of(h);
                    ctx.probs(bi, kvh, g.head(q, row, qw, h), p);
                    ctx.score_grads(bi, kvh, g.head(ctx.dout, row, qw, h), p, dp);
                    let dh = &mut d[h * g.head_dim..(h + 1) * g.head_dim];
                    dh.fill(0.0);
                    for (j, &ds) in p.iter().enumerate() {
                        axpy(g.scale * ds, g.head(ctx.k, bi * g.t_k + j, kvw, kvh), dh);
                    }
                }
            },
        );
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

// ---------------------------------------------------------------------------------------------
// Rotary embedding
// ---------------------------------------------------------------------------------------------

/// Rotary position embedding (LLaMA / HF "rotate_half" convention) on x: `[b, t, heads*head_dim]`:
/// for each head, the pairs `(i, i + head_dim/2)`, `i < head_dim/2`, at position p (the t index)
/// are rotated by the angle `p * base^(-2i/head_dim)` (computed in f64, applied in f32).
/// `inverse = true` rotates by the negative angle, which is the exact backward (transpose) of
/// the forward rotation. `head_dim` is even; `out` is fully overwritten.
#[allow(clippy::too_many_arguments)]
pub fn rope(
    x: &[f32],
    b: usize,
    t: usize,
    heads: usize,
    head_dim: usize,
    base: f32,
    inverse: bool,
    out: &mut [f32],
) {
    let (width, half) = (heads * head_dim, head_dim / 2);
    let sign = if inverse { -1.0 } else { 1.0 };
    par_chunks(&mut out[..b * t * width], width, |o, row| {
        let xr = &x[row * width..(row + 1) * width];
        let pos = (row % t) as f64;
        for i in 0..half {
            let freq = (base as f64).powf(-2.0 * i as f64 / head_dim as f64);
            let (s, c) = (pos * freq).sin_cos();
            let (s, c) = ((sign * s) as f32, c as f32);
            for h in 0..heads {
                let (lo, hi) = (h * head_dim + i, h * head_dim + i + half);
                o[lo] = xr[lo] * c - xr[hi] * s;
                o[hi] = xr[hi] * c + xr[lo] * s;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    //! Forward kernels are checked against naive references; backward kernels against central
    //! finite differences of `sum(forward(x) * r)` (f64 loss accumulation, eps 1e-2, or 1e-3
    //! for max pool on inputs with gaps of 1e-2), with relative L2 error below 1e-2.
    use super::super::testing::{central_diff, dot, rel_err, Rng};
    use super::*;

    fn assert_close<W: Copy + Into<f64>>(got: &[f32], want: &[W], tol: f64, what: &str) {
        let e = rel_err(got, want);
        assert!(e < tol, "{what}: relative error {e}");
    }

    fn naive_matmul(
        a: &[f32],
        ash: &[usize],
        ta: bool,
        b: &[f32],
        bsh: &[usize],
        tb: bool,
        osh: &[usize],
    ) -> Vec<f32> {
        let (ar, br, or) = (ash.len(), bsh.len(), osh.len());
        let (m, n) = (osh[or - 2], osh[or - 1]);
        let k = if ta { ash[ar - 2] } else { ash[ar - 1] };
        let batches: usize = osh[..or - 2].iter().product();
        let mut out = vec![0.0; batches * m * n];
        for bi in 0..batches {
            let ao = batch_offset(bi, &osh[..or - 2], &ash[..ar - 2]) * m * k;
            let bo = batch_offset(bi, &osh[..or - 2], &bsh[..br - 2]) * k * n;
            for i in 0..m {
                for j in 0..n {
                    let mut s = 0.0f64;
                    for p in 0..k {
                        let av = if ta {
                            a[ao + p * m + i]
                        } else {
                            a[ao + i * k + p]
                        };
                        let bv = if tb {
                            b[bo + j * k + p]
                        } else {
                            b[bo + p * n + j]
                        };
                        s += av as f64 * bv as f64;
                    }
                    out[(bi * m + i) * n + j] = s as f32;
                }
            }
        }
        out
    }

    fn check_matmul(
        rng: &mut Rng,
        ash: &[usize],
        ta: bool,
        bsh: &[usize],
        tb: bool,
        osh: &[usize],
    ) {
        let a = rng.vec(ash.iter().product());
        let b = rng.vec(bsh.iter().product());
        let want = naive_matmul(&a, ash, ta, &b, bsh, tb, osh);
        let mut out = vec![f32::NAN; want.len()];
        matmul(&a, ash, ta, &b, bsh, tb, &mut out, osh);
        assert_close(
            &out,
            &want,
            1e-5,
            &format!("matmul {ash:?} {ta} {bsh:?} {tb}"),
        );
    }

    #[test]
    fn matmul_transposes_and_broadcast() {
        let mut rng = Rng(0x9e3779b97f4a7c15);
        let (m, k, n) = (3, 5, 4);
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let ash = |bat: &[usize]| [bat, &if ta { [k, m] } else { [m, k] }].concat();
            let bsh = |bat: &[usize]| [bat, &if tb { [n, k] } else { [k, n] }].concat();
            check_matmul(&mut rng, &ash(&[2, 1]), ta, &bsh(&[3]), tb, &[2, 3, m, n]);
            check_matmul(&mut rng, &ash(&[]), ta, &bsh(&[]), tb, &[m, n]);
            check_matmul(&mut rng, &ash(&[2, 3]), ta, &bsh(&[]), tb, &[2, 3, m, n]);
            check_matmul(
                &mut rng,
                &ash(&[]),
                ta,
                &bsh(&[2, 1, 3]),
                tb,
                &[2, 1, 3, m, n],
            );
        }
        // Large enough for matrixmultiply's own threading, with a batch.
        check_matmul(
            &mut rng,
            &[2, 130, 70],
            true,
            &[2, 130, 90],
            false,
            &[2, 70, 90],
        );
        // k = 0 must still overwrite the output with zeros.
        let mut out = vec![f32::NAN; 6];
        matmul(&[], &[2, 0], false, &[], &[0, 3], false, &mut out, &[2, 3]);
        assert_eq!(out, vec![0.0; 6]);
    }

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

    fn pool_geoms() -> [Pool2dGeom; 2] {
        let g = Pool2dGeom {
            n: 2,
            c: 3,
            h: 7,
            w: 6,
            kernel: [3, 2],
            stride: [2, 1],
            padding: [1, 1],
        };
        [
            g,
            Pool2dGeom {
                kernel: [2, 2],
                stride: [2, 2],
                padding: [0, 0],
                ..g
            },
        ]
    }

    fn naive_pool(g: &Pool2dGeom, x: &[f32], max: bool) -> Vec<f32> {
        let (ho, wo) = (g.h_out(), g.w_out());
        let mut out = Vec::new();
        for plane in 0..g.n * g.c {
            for oh in 0..ho {
                for ow in 0..wo {
                    let mut vals = Vec::new();
                    for ki in 0..g.kernel[0] {
                        for kj in 0..g.kernel[1] {
                            let ih = (oh * g.stride[0] + ki) as isize - g.padding[0] as isize;
                            let iw = (ow * g.stride[1] + kj) as isize - g.padding[1] as isize;
                            if ih >= 0 && iw >= 0 && ih < g.h as isize && iw < g.w as isize {
                                vals.push(x[(plane * g.h + ih as usize) * g.w + iw as usize]);
                            }
                        }
                    }
                    out.push(if max {
                        vals.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b))
                    } else {
                        vals.iter().sum::<f32>() / (g.kernel[0] * g.kernel[1]) as f32
                    });
                }
            }
        }
        out
    }

    /// Distinct values with gaps of 1e-2 (a shuffled ramp), so max-pool FD never crosses a tie.
    fn distinct(rng: &mut Rng, n: usize) -> Vec<f32> {
        let mut v: Vec<f32> = (0..n).map(|i| i as f32 * 1e-2 - 1.0).collect();
        for i in (1..n).rev() {
            let j = ((rng.next() + 1.0) * 0.5 * i as f32) as usize % (i + 1);
            v.swap(i, j);
        }
        v
    }

    #[test]
    fn pooling_matches_naive_and_finite_differences() {
        let mut rng = Rng(5);
        for g in pool_geoms() {
            let x = distinct(&mut rng, g.n * g.c * g.h * g.w);
            let r = rng.vec(g.n * g.c * g.h_out() * g.w_out());
            let fwd = |x: &[f32], max: bool| {
                let mut out = vec![f32::NAN; r.len()];
                (if max {
                    max_pool2d_forward
                } else {
                    avg_pool2d_forward
                })(&g, x, &mut out);
                out
            };
            for max in [true, false] {
                assert_close(
                    &fwd(&x, max),
                    &naive_pool(&g, &x, max),
                    1e-6,
                    "pool forward",
                );
                let mut dx = vec![f32::NAN; x.len()];
                if max {
                    max_pool2d_backward(&g, &x, &r, &mut dx);
                } else {
                    avg_pool2d_backward(&g, &r, &mut dx);
                }
                let want = central_diff(&x, 1e-3, |x| dot(&fwd(x, max), &r));
                assert_close(&dx, &want, 1e-2, "pool backward");
            }
        }
    }

    #[test]
    fn max_pool_gradient_goes_to_first_maximum() {
        let g = Pool2dGeom {
            n: 1,
            c: 1,
            h: 2,
            w: 2,
            kernel: [2, 2],
            stride: [2, 2],
            padding: [0, 0],
        };
        let mut dx = vec![f32::NAN; 4];
        max_pool2d_backward(&g, &[0.0, 1.0, 1.0, 1.0], &[3.0], &mut dx);
        assert_eq!(dx, vec![0.0, 3.0, 0.0, 0.0]);
    }

    fn naive_attention(g: &AttnGeom, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f32> {
        let (qw, kvw, hd) = (g.heads * g.head_dim, g.kv_heads * g.head_dim, g.head_dim);
        let mut out = vec![0.0; g.b * g.t_q * qw];
        for b in 0..g.b {
            for h in 0..g.heads {
                let kvh = h / (g.heads / g.kv_heads);
                // The full t_q x t_k score matrix.
                let s: Vec<Vec<f64>> = (0..g.t_q)
                    .map(|i| {
                        (0..g.t_k)
                            .map(|j| {
                                if g.causal
                                    && j as isize > i as isize + g.t_k as isize - g.t_q as isize
                                {
                                    return f64::NEG_INFINITY;
                                }
                                let qo = (b * g.t_q + i) * qw + h * hd;
                                let ko = (b * g.t_k + j) * kvw + kvh * hd;
                                (0..hd)
                                    .map(|d| q[qo + d] as f64 * k[ko + d] as f64)
                                    .sum::<f64>()
                                    * g.scale as f64
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
        let base = AttnGeom {
            b: 2,
            t_q: 5,
            t_k: 5,
            heads: 4,
            kv_heads: 2,
            head_dim: 3,
            causal: false,
            scale: 0.7,
        };
        vec![
            base,
            AttnGeom {
                causal: true,
                ..base
            },
            AttnGeom {
                causal: true,
                t_q: 3,
                t_k: 6,
                ..base
            },
            AttnGeom {
                kv_heads: 4,
                t_q: 4,
                t_k: 6,
                ..base
            },
        ]
    }

    fn attn_inputs(g: &AttnGeom, rng: &mut Rng) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let (qw, kvw) = (g.heads * g.head_dim, g.kv_heads * g.head_dim);
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
            heads: 4,
            kv_heads: 1,
            head_dim: 8,
            causal: true,
            scale: 0.35,
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

    #[test]
    fn rope_matches_reference_and_inverse_undoes_it() {
        let (b, t, heads, hd, base) = (2, 5, 3, 6, 10000.0f32);
        let x = Rng(17).vec(b * t * heads * hd);
        let mut y = vec![f32::NAN; x.len()];
        rope(&x, b, t, heads, hd, base, false, &mut y);
        let mut want = vec![0.0; x.len()];
        for row in 0..b * t {
            for h in 0..heads {
                for i in 0..hd / 2 {
                    let ang = (row % t) as f64 / (base as f64).powf(2.0 * i as f64 / hd as f64);
                    let o = row * heads * hd + h * hd;
                    let (a, c) = (x[o + i] as f64, x[o + i + hd / 2] as f64);
                    want[o + i] = (a * ang.cos() - c * ang.sin()) as f32;
                    want[o + i + hd / 2] = (c * ang.cos() + a * ang.sin()) as f32;
                }
            }
        }
        assert_close(&y, &want, 1e-6, "rope forward");
        let mut back = vec![f32::NAN; x.len()];
        rope(&y, b, t, heads, hd, base, true, &mut back);
        assert_close(&back, &x, 1e-6, "rope inverse");
    }
}
