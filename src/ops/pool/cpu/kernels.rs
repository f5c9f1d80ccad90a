//! 2-D max and average pooling and their backwards (torch semantics). Work is split only over
//! independent planes, so results are bitwise identical from run to run.

use crate::exec::kernels::layout::{out_len, par_chunks};

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

#[cfg(test)]
mod tests {
    //! Forward kernels are checked against naive references; backward kernels against central
    //! finite differences of `sum(forward(x) * r)` (f64 loss accumulation, eps 1e-3 for max pool on inputs with gaps of 1e-2), with
    //! relative L2 error below 1e-2.
    use super::*;
    use crate::exec::kernels::testing::{assert_close, central_diff, dot, Rng};

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
            ..pool_geoms()[1]
        };
        let mut dx = vec![f32::NAN; 4];
        max_pool2d_backward(&g, &[0.0, 1.0, 1.0, 1.0], &[3.0], &mut dx);
        assert_eq!(dx, vec![0.0, 3.0, 0.0, 0.0]);
    }
}
