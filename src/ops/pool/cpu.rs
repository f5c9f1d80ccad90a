//! CPU reference kernels of the pool ops (2-D max and average pooling and their backwards).

mod kernels;

use crate::exec::cpu::CpuStep;
use crate::exec::ExecError;
use crate::ir::{Op, PoolParams, TensorType};
use crate::ops::cpu::{foreign_op, CpuKernel};
use kernels::Pool2dGeom;

/// Geometry of a pooling from its (NCHW) input shape.
fn pool_geom(p: &PoolParams, x: &[usize]) -> Pool2dGeom {
    Pool2dGeom {
        n: x[0],
        c: x[1],
        h: x[2],
        w: x[3],
        kernel: p.kernel,
        stride: p.stride,
        padding: p.padding,
    }
}

impl CpuKernel for super::Family {
    fn run_cpu(&self, step: &CpuStep) -> Result<(), ExecError> {
        let (x, s, out) = (|i| step.input(i), step.shape(0), step.output());
        match step.op() {
            Op::MaxPool2d(p) => kernels::max_pool2d_forward(&pool_geom(p, s), x(0), out),
            Op::MaxPool2dBackward(p) => {
                kernels::max_pool2d_backward(&pool_geom(p, s), x(0), x(1), out)
            }
            Op::AvgPool2d(p) => kernels::avg_pool2d_forward(&pool_geom(p, s), x(0), out),
            Op::AvgPool2dBackward { pool, .. } => {
                kernels::avg_pool2d_backward(&pool_geom(pool, step.out_shape()), x(0), out)
            }
            op => return Err(foreign_op(op, "pool")),
        }
        Ok(())
    }

    fn cpu_workspace_bytes(&self, _: &Op, _: &[&TensorType], _: &TensorType) -> u64 {
        0
    }
}
