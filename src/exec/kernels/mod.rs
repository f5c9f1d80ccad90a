//! CPU reference kernels: pure functions over f32/i32 slices viewed in the arena.
pub mod dense;
pub mod loss;
pub mod movement;
pub mod norm;
pub mod optim;
pub mod pointwise;
pub mod reduce;
pub mod rng;
#[cfg(test)]
mod testing;

use crate::ir::{Op, TensorType};

/// Geometry of a conv2d node from its input (NCHW) and weight types.
pub fn conv_geom(conv: &crate::ir::ConvParams, x: &[usize], w: &[usize]) -> dense::Conv2dGeom {
    dense::Conv2dGeom {
        n: x[0],
        c_in: x[1],
        h: x[2],
        w: x[3],
        c_out: w[0],
        kh: w[2],
        kw: w[3],
        stride: conv.stride,
        padding: conv.padding,
        dilation: conv.dilation,
        groups: conv.groups,
    }
}

/// Bytes of scratch the CPU kernel of `op` needs, placed in the arena as a workspace buffer.
pub fn workspace_bytes(op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
    crate::ops::family(op).cpu_workspace_bytes(op, inputs, out)
}

pub(crate) fn workspace_bytes_legacy(op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
    let len = match op {
        Op::Conv2d(c) => {
            dense::conv2d_workspace_len(&conv_geom(c, &inputs[0].shape, &inputs[1].shape))
        }
        Op::Conv2dBackwardInput { conv, .. } => {
            dense::conv2d_workspace_len(&conv_geom(conv, &out.shape, &inputs[1].shape))
        }
        Op::Conv2dBackwardWeight { conv, .. } => {
            dense::conv2d_workspace_len(&conv_geom(conv, &inputs[0].shape, &out.shape))
        }
        _ => 0,
    };
    len as u64 * 4
}
