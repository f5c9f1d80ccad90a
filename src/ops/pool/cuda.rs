//! CUDA lowering of 2-D max and average pooling and their gather-form backwards onto
//! `pool.cu`.

use crate::codegen::build::{c_bool, c_u64};
use crate::codegen::geometry::{u, window_consts};
use crate::codegen::launch::{single, templated, Launch};
use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel, KernelParam};
use crate::ir::{Op, PoolParams};
use crate::ops::cuda::CudaLowering;

/// `pool.cu`: the pooling forward and backward templates.
const TEMPLATE: &str = include_str!("pool.cu");

/// Pooling constants for input `x` and pooled `y` (NCHW), `n` elements written.
fn pool_cfg(p: &PoolParams, x: &[usize], y: &[usize], max: bool, n: u64) -> Vec<String> {
    let mut consts = vec![
        c_u64("N", n),
        c_u64("H", u(x[2])),
        c_u64("W", u(x[3])),
        c_u64("HO", u(y[2])),
        c_u64("WO", u(y[3])),
        c_u64("KH", u(p.kernel[0])),
        c_u64("KW", u(p.kernel[1])),
    ];
    consts.extend(window_consts(p.stride, p.padding));
    consts.push(c_bool("MAX", max));
    consts
}

impl CudaLowering for super::Family {
    fn lower(&self, a: &Args) -> Result<Kernel, CodegenError> {
        let out = a.output;
        let n_out = out.numel();
        match a.op {
            Op::MaxPool2d(p) | Op::AvgPool2d(p) => {
                let max = matches!(a.op, Op::MaxPool2d(_));
                let x = a.at(0)?;
                Ok(templated(
                    if max { "max_pool2d" } else { "avg_pool2d" },
                    &[TEMPLATE],
                    pool_cfg(p, &x.shape, &out.shape, max, n_out),
                    ("pool_kernel", &[a.ty(0)?], 1),
                    Launch::Elementwise(n_out),
                ))
            }
            Op::MaxPool2dBackward(p) => {
                let (x, dy) = (a.at(0)?, a.at(1)?);
                Ok(templated(
                    "max_pool2d_backward",
                    &[TEMPLATE],
                    pool_cfg(p, &x.shape, &dy.shape, true, n_out),
                    ("pool_backward_kernel", &[a.ty(0)?, a.ty(1)?], 2),
                    Launch::Elementwise(n_out),
                ))
            }
            Op::AvgPool2dBackward { pool, .. } => {
                let dy = a.at(0)?;
                // The template's first input (the forward x) is unread for average pooling.
                let call = format!(
                    "pool_backward_kernel<{}, {}, Cfg>(arena, in0, in0, out)",
                    a.out_ty(),
                    a.ty(0)?
                );
                Ok(single(
                    "avg_pool2d_backward",
                    &[TEMPLATE],
                    pool_cfg(pool, &out.shape, &dy.shape, false, n_out),
                    call,
                    &[KernelParam::Input(0), KernelParam::Output],
                    Launch::Elementwise(n_out),
                ))
            }
            _ => Err(a.foreign("pool")),
        }
    }
}
