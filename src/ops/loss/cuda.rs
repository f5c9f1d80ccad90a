//! CUDA lowering of the losses onto `loss.cu`: cross-entropy and MSE (one block, fixed
//! order) and their elementwise backwards.

use crate::codegen::build::{c_type, c_u64};
use crate::codegen::geometry::{numel, pow2_block, u};
use crate::codegen::launch::{templated, Launch};
use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel};
use crate::ir::Op;
use crate::ops::cuda::CudaLowering;

/// `loss.cu`: the cross-entropy and MSE templates and their backwards.
const TEMPLATE: &str = include_str!("loss.cu");

/// (rows, classes) of logits `shape`: the last dim holds the classes.
fn rows_classes(shape: &[usize]) -> (u64, u64) {
    let cl = shape.last().map_or(1, |&c| u(c));
    (numel(shape).checked_div(cl).unwrap_or(0), cl)
}

impl CudaLowering for super::Family {
    fn lower(&self, a: &Args) -> Result<Kernel, CodegenError> {
        let n_out = a.output.numel();
        match a.op {
            Op::CrossEntropy => {
                let (rows, cl) = rows_classes(&a.at(0)?.shape);
                Ok(templated(
                    "cross_entropy",
                    &[TEMPLATE],
                    vec![c_u64("ROWS", rows), c_u64("CL", cl)],
                    ("cross_entropy_kernel", &[a.ty(0)?], 2),
                    Launch::Grid([1, 1, 1], pow2_block(cl, 32, 1024)),
                ))
            }
            Op::CrossEntropyBackward => {
                let (rows, cl) = rows_classes(&a.at(0)?.shape);
                Ok(templated(
                    "cross_entropy_backward",
                    &[TEMPLATE],
                    vec![c_u64("ROWS", rows), c_u64("CL", cl), c_type("TL", a.ty(2)?)],
                    ("cross_entropy_backward_kernel", &[a.ty(0)?], 3),
                    Launch::PerBlock(rows, pow2_block(cl, 32, 256)),
                ))
            }
            Op::Mse => Ok(templated(
                "mse",
                &[TEMPLATE],
                vec![c_u64("N", a.at(0)?.numel())],
                ("mse_kernel", &[a.ty(0)?], 2),
                Launch::Grid([1, 1, 1], 1024),
            )),
            Op::MseBackward => Ok(templated(
                "mse_backward",
                &[TEMPLATE],
                vec![c_u64("N", n_out), c_type("TL", a.ty(2)?)],
                ("mse_backward_kernel", &[a.ty(0)?], 3),
                Launch::Elementwise(n_out),
            )),
            _ => Err(a.foreign("loss")),
        }
    }
}
