//! CUDA lowering of dropout onto `rng.cu`, the counter-based RNG that matches the CPU
//! backend's stream bit for bit.

use crate::codegen::build::{c_f32, c_u64};
use crate::codegen::launch::{single, Launch};
use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel, KernelParam};
use crate::ir::Op;
use crate::ops::cuda::CudaLowering;

use super::RNG_CU as TEMPLATE;

impl CudaLowering for super::Family {
    fn lower(&self, a: &Args) -> Result<Kernel, CodegenError> {
        match a.op {
            Op::Dropout { p, seed } => {
                let n = a.output.numel();
                Ok(single(
                    "dropout",
                    &[TEMPLATE],
                    vec![c_u64("N", n), c_f32("P", *p), c_u64("SEED", *seed)],
                    format!(
                        "dropout_kernel<{}, Cfg>(arena, in0, out, stream)",
                        a.out_ty()
                    ),
                    &[
                        KernelParam::Input(0),
                        KernelParam::Output,
                        KernelParam::Stream,
                    ],
                    Launch::Elementwise(n),
                ))
            }
            _ => Err(a.foreign("random")),
        }
    }
}
