//! CUDA lowering of Cast: the `cast_kernel` template, which lives in the pointwise family's
//! `pointwise.cu` beside the other elementwise templates.

use crate::codegen::build::{c_u64, Gen};
use crate::codegen::ops::Args;
use crate::codegen::{ctype, CodegenError, Kernel, KernelParam};
use crate::ir::{DType, Op};
use crate::ops::cuda::CudaLowering;

impl super::Family {
    /// The `cast` kernel converting `numel` contiguous elements from `from` to `to` (through
    /// fp32, round-to-nearest-even when narrowing); arguments: arena, input offset, output
    /// offset.
    pub(crate) fn kernel(from: DType, to: DType, numel: u64) -> Kernel {
        let mut k = Gen::new("cast", &[crate::ops::pointwise::Family::TEMPLATE]);
        k.cfg("Cfg", vec![c_u64("N", numel)]);
        k.call(format!(
            "cast_kernel<{}, {}, Cfg>(arena, in0, out)",
            ctype(from),
            ctype(to)
        ));
        k.params(&[KernelParam::Input(0), KernelParam::Output]);
        k.elementwise(numel);
        k.finish()
    }
}

impl CudaLowering for super::Family {
    fn lower(&self, a: &Args) -> Result<Kernel, CodegenError> {
        match a.op {
            Op::Cast { to } => Ok(Self::kernel(a.at(0)?.dtype, *to, a.output.numel())),
            _ => Err(a.foreign("cast")),
        }
    }
}
