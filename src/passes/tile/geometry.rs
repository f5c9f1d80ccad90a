//! How a sliding window moves a tiled axis's grid: convolutions and pools (strided reads)
//! and transposed convolutions (strided writes), with kernel, stride, dilation and padding.

use super::atoms::Grid;

/// One spatial axis of a convolution or pool: output element `j` reads input elements
/// `j*stride - padding + t*dilation` for taps `t` in `0..kernel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub kernel: usize,
    pub stride: usize,
    pub padding: usize,
    pub dilation: usize,
}

impl Window {
    /// Whether every output element reads exactly the input element at its own index.
    pub fn is_identity(self) -> bool {
        self.kernel == 1 && self.stride == 1 && self.padding == 0
    }

    /// The grid of a convolution's (or pool's) output read from an input on `g`: cells
    /// `stride` times wider, reaching `padding` input elements further back and the last
    /// tap's cell further forward (never less than the cell itself).
    pub fn forward(self, g: Grid) -> Grid {
        let reach = self.dilation * (self.kernel - 1) + 1;
        let r = g.r * self.stride;
        let hi = (reach * g.r + g.hi).saturating_sub((self.padding + self.stride) * g.r);
        Grid {
            r,
            lo: self.padding * g.r + g.lo,
            hi,
        }
    }

    /// The grid of a transposed convolution's output (the adjoint of this window read from
    /// the output back to the input) from an input on `g`: cells `stride` times narrower;
    /// None when the input's cells are not a multiple of the stride (an output finer than
    /// the input's voxels). Output element `j` receives input elements `i` with
    /// `i*stride - padding + t*dilation = j`, all within `ceil((j + padding - reach + 1) /
    /// stride) ..= floor((j + padding) / stride)`; the pattern repeats every `stride`
    /// elements, so the reach is the largest over `j` in `0..stride`.
    pub fn transposed(self, g: Grid) -> Option<Grid> {
        if !g.r.is_multiple_of(self.stride) {
            return None;
        }
        let r = g.r / self.stride;
        let (s, p) = (self.stride as i64, self.padding as i64);
        let span = (self.dilation * (self.kernel - 1)) as i64;
        let (ri, ro) = (g.r as i64, r as i64);
        let (mut lo, mut hi) = (0i64, 0i64);
        for j in 0..s {
            let first = (j + p - span).div_euclid(s) + i64::from((j + p - span).rem_euclid(s) != 0);
            let last = (j + p).div_euclid(s);
            lo = lo.max(j * ro - first * ri + g.lo as i64);
            hi = hi.max((last + 1) * ri + g.hi as i64 - (j + 1) * ro);
        }
        Some(Grid {
            r,
            lo: lo.max(0) as usize,
            hi: hi.max(0) as usize,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(kernel: usize, stride: usize, padding: usize, dilation: usize) -> Window {
        Window {
            kernel,
            stride,
            padding,
            dilation,
        }
    }

    #[test]
    fn convolutions_widen_the_reach_by_the_kernel() {
        let g = w(3, 1, 1, 1).forward(Grid::INPUT);
        assert_eq!(g, Grid { r: 1, lo: 1, hi: 1 });
        let g = w(3, 1, 2, 2).forward(g);
        assert_eq!(g, Grid { r: 1, lo: 3, hi: 3 });
        let pooled = w(2, 2, 0, 1).forward(g);
        assert_eq!(pooled, Grid { r: 2, lo: 3, hi: 3 });
        // A 3x3 convolution after pooling reads one element of two voxels each way.
        assert_eq!(w(3, 1, 1, 1).forward(pooled), Grid { r: 2, lo: 5, hi: 5 });
    }

    #[test]
    fn transposed_convolutions_split_cells() {
        let coarse = Grid {
            r: 8,
            lo: 30,
            hi: 30,
        };
        // 2x2x2 stride 2: element j reads input floor(j/2), whose cell spans j's sibling too.
        assert_eq!(
            w(2, 2, 0, 1).transposed(coarse),
            Some(Grid {
                r: 4,
                lo: 34,
                hi: 34
            })
        );
        assert_eq!(w(2, 2, 0, 1).transposed(Grid { r: 1, lo: 0, hi: 0 }), None);
        // 3x3 stride 1 padding 1 transposed is a 3x3 convolution.
        assert_eq!(
            w(3, 1, 1, 1).transposed(Grid::INPUT),
            Some(Grid { r: 1, lo: 1, hi: 1 })
        );
    }
}
