//! N-d convolution (1-D, 2-D and 3-D; groups, stride, padding, dilation), its backward ops
//! and the transposed convolution. Every kernel works on a 3-D geometry: a convolution of
//! fewer spatial dimensions is the 3-D one with leading spatial extents of 1 (kernel 1,
//! stride 1, no padding, dilation 1), which computes exactly the same sums.

mod backward;
mod cpu;
mod cuda;
mod rules;

use serde::{Deserialize, Serialize};

/// The conv family; every stage's rule for its ops is implemented on it.
pub struct Family;

impl super::OpFamily for Family {}

/// Geometry shared by a convolution and its backward ops: one entry per spatial dimension
/// (1, 2 or 3 of them; `infer` refuses lists whose length differs from the operands'
/// spatial rank).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConvParams {
    /// Step between output positions, per spatial axis.
    pub stride: Vec<usize>,
    /// Zeros added at both ends of each spatial axis of the input.
    pub padding: Vec<usize>,
    /// Step between kernel taps, per spatial axis.
    pub dilation: Vec<usize>,
    /// Channel groups: input and output channels split into this many independent parts.
    pub groups: usize,
}

impl ConvParams {
    /// A convolution of `rank` spatial dimensions with the same stride, padding and dilation
    /// along each.
    pub fn uniform(rank: usize, stride: usize, padding: usize, dilation: usize) -> Self {
        ConvParams {
            stride: vec![stride; rank],
            padding: vec![padding; rank],
            dilation: vec![dilation; rank],
            groups: 1,
        }
    }

    /// The number of spatial dimensions (the length of `stride`).
    pub fn rank(&self) -> usize {
        self.stride.len()
    }
}

/// The spatial dimensions a convolution kernel works on: 3.
pub(crate) const SPATIAL: usize = 3;

/// `v`'s last (at most three) entries right-aligned in three, the leading ones `fill`.
pub(crate) fn lift(v: &[usize], fill: usize) -> [usize; SPATIAL] {
    let mut out = [fill; SPATIAL];
    let tail = &v[v.len().saturating_sub(SPATIAL)..];
    out[SPATIAL - tail.len()..].copy_from_slice(tail);
    out
}

/// A convolution as its kernels see it: input `[n, c_in, size...]`, weight
/// `[c_out, c_in/groups, kernel...]`, spatial dimensions lifted to three by [`lift`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Geom {
    /// Batch size.
    pub n: usize,
    /// Input channels (of the convolution, not of its adjoint).
    pub c_in: usize,
    /// Output channels.
    pub c_out: usize,
    /// Channel groups; divides both channel counts.
    pub groups: usize,
    /// Input extents (D, H, W).
    pub size: [usize; SPATIAL],
    /// Kernel extents.
    pub kernel: [usize; SPATIAL],
    /// Strides.
    pub stride: [usize; SPATIAL],
    /// Zero padding on each side.
    pub padding: [usize; SPATIAL],
    /// Dilations.
    pub dilation: [usize; SPATIAL],
}

impl Geom {
    /// The geometry of convolving `x` (`[N, C, spatial...]`) by `w` (`[O, C/g, kernel...]`)
    /// under `c`; shapes as `infer` guarantees them.
    pub fn new(c: &ConvParams, x: &[usize], w: &[usize]) -> Geom {
        Geom {
            n: x[0],
            c_in: x[1],
            c_out: w[0],
            groups: c.groups,
            size: lift(&x[2..], 1),
            kernel: lift(&w[2..], 1),
            stride: lift(&c.stride, 1),
            padding: lift(&c.padding, 0),
            dilation: lift(&c.dilation, 1),
        }
    }

    /// The output's spatial extents (0 where the kernel does not fit).
    pub fn out(&self) -> [usize; SPATIAL] {
        std::array::from_fn(|d| {
            crate::exec::kernels::layout::out_len(
                self.size[d],
                self.kernel[d],
                self.stride[d],
                self.padding[d],
                self.dilation[d],
            )
        })
    }
}
