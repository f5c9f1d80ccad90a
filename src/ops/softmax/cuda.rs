//! CUDA lowering of softmax and log-softmax and their backwards onto `softmax.cu`: one block
//! per lane of the axis.

use crate::codegen::build::{c_bool, c_u64};
use crate::codegen::geometry::{axis_split, pow2_block};
use crate::codegen::launch::{templated, Launch};
use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel};
use crate::ir::Op;
use crate::ops::cuda::CudaLowering;

/// `softmax.cu`: the softmax / log-softmax templates and their backwards.
const TEMPLATE: &str = include_str!("softmax.cu");

/// Softmax constants over `axis` of `shape` and the launch: a block per row.
fn softmax_cfg(shape: &[usize], axis: usize, log: bool) -> (Vec<String>, Launch) {
    let (outer, n, inner) = axis_split(shape, axis);
    let lines = vec![
        c_u64("OUTER", outer),
        c_u64("N", n),
        c_u64("INNER", inner),
        c_bool("LOG", log),
    ];
    (
        lines,
        Launch::PerBlock(outer * inner, pow2_block(n, 32, 256)),
    )
}

impl CudaLowering for super::Family {
    fn lower(&self, a: &Args) -> Result<Kernel, CodegenError> {
        let shape = &a.output.shape;
        match a.op {
            Op::Softmax { axis } | Op::LogSoftmax { axis } => {
                let log = matches!(a.op, Op::LogSoftmax { .. });
                let (lines, launch) = softmax_cfg(shape, *axis, log);
                let family = if log { "log_softmax" } else { "softmax" };
                let entry = ("softmax_kernel", &[a.out_ty()][..], 1);
                Ok(templated(family, &[TEMPLATE], lines, entry, launch))
            }
            Op::SoftmaxBackward { axis } | Op::LogSoftmaxBackward { axis } => {
                let log = matches!(a.op, Op::LogSoftmaxBackward { .. });
                let (lines, launch) = softmax_cfg(shape, *axis, log);
                let family = if log {
                    "log_softmax_backward"
                } else {
                    "softmax_backward"
                };
                let entry = ("softmax_backward_kernel", &[a.ty(0)?, a.ty(1)?][..], 2);
                Ok(templated(family, &[TEMPLATE], lines, entry, launch))
            }
            _ => Err(a.foreign("softmax")),
        }
    }
}
