//! CUDA lowering of the source ops: Input, Param and OptimState have no kernel; Fill is the
//! `fill_kernel` of the pointwise template.

use crate::codegen::build::{c_f32, c_u64};
use crate::codegen::launch::{templated, Launch};
use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel};
use crate::ir::Op;
use crate::ops::cuda::CudaLowering;

impl CudaLowering for super::Family {
    fn lower(&self, a: &Args) -> Result<Kernel, CodegenError> {
        match a.op {
            Op::Input { .. } | Op::Param { .. } | Op::OptimState { .. } => {
                Err(a.err("source ops have no kernel"))
            }
            Op::Fill { value, .. } => {
                let n = a.output.numel();
                Ok(templated(
                    "fill",
                    &[crate::ops::pointwise::Family::TEMPLATE],
                    vec![c_u64("N", n), c_f32("VALUE", *value)],
                    ("fill_kernel", &[a.out_ty()], 0),
                    Launch::Elementwise(n),
                ))
            }
            _ => Err(a.foreign("source")),
        }
    }
}
