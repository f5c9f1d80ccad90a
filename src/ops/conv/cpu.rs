//! CPU reference kernels of the conv ops (2-D convolution and its input and weight
//! backwards), which stage im2col tiles in a workspace buffer.

mod kernels;

use crate::exec::cpu::CpuStep;
use crate::exec::ExecError;
use crate::ir::{ConvParams, Op, TensorType};
use crate::ops::cpu::{foreign_op, CpuKernel};
use kernels::Conv2dGeom;

/// Geometry of a conv2d from its input (NCHW) and weight shapes.
fn conv_geom(conv: &ConvParams, x: &[usize], w: &[usize]) -> Conv2dGeom {
    Conv2dGeom {
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

impl CpuKernel for super::Family {
    fn run_cpu(&self, step: &CpuStep) -> Result<(), ExecError> {
        let (x, s, out_shape) = (|i| step.input(i), |i| step.shape(i), step.out_shape());
        let (out, ws) = (step.output(), step.workspace());
        match step.op() {
            Op::Conv2d(c) => {
                kernels::conv2d_forward(&conv_geom(c, s(0), s(1)), x(0), x(1), out, ws)
            }
            Op::Conv2dBackwardInput { conv, .. } => kernels::conv2d_backward_input(
                &conv_geom(conv, out_shape, s(1)),
                x(0),
                x(1),
                out,
                ws,
            ),
            Op::Conv2dBackwardWeight { conv, .. } => kernels::conv2d_backward_weight(
                &conv_geom(conv, s(0), out_shape),
                x(0),
                x(1),
                out,
                ws,
            ),
            op => return Err(foreign_op(op, "conv")),
        }
        Ok(())
    }

    fn cpu_workspace_bytes(&self, op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
        let geom = match op {
            Op::Conv2d(c) => conv_geom(c, &inputs[0].shape, &inputs[1].shape),
            Op::Conv2dBackwardInput { conv, .. } => conv_geom(conv, &out.shape, &inputs[1].shape),
            Op::Conv2dBackwardWeight { conv, .. } => conv_geom(conv, &inputs[0].shape, &out.shape),
            _ => return 0,
        };
        kernels::conv2d_workspace_len(&geom) as u64 * 4
    }
}
