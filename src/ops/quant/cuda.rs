//! CUDA lowering of `Dequantize` onto `quant.cu`: one elementwise kernel per scheme whose
//! configuration carries the packed layout's offsets.

use super::pack::Layout;
use super::Scheme;
use crate::codegen::build::{c_u64, Gen};
use crate::codegen::ops::Args;
use crate::codegen::{ctype, CodegenError, Kernel, KernelParam};
use crate::ir::Op;
use crate::ops::cuda::CudaLowering;

impl CudaLowering for super::Family {
    fn lower(&self, a: &Args) -> Result<Kernel, CodegenError> {
        let Op::Dequantize { quant, to } = a.op else {
            return Err(a.foreign("quant"));
        };
        let layout = Layout::of(quant);
        let n = quant.numel();
        let mut k = Gen::new("dequantize", &[include_str!("quant.cu")]);
        let (entry, cfg) = match quant.scheme {
            Scheme::Int8 => (
                "dequantize_int8",
                vec![
                    c_u64("N", n),
                    c_u64("COLS", quant.shape[1] as u64),
                    c_u64("OUT_AXIS", quant.out_axis as u64),
                    c_u64("SCALES", layout.scales),
                ],
            ),
            Scheme::Nf4 => (
                "dequantize_nf4",
                vec![
                    c_u64("N", n),
                    c_u64("ABSMAX", layout.absmax_codes),
                    c_u64("SCALES", layout.scales),
                    c_u64("MEAN", layout.mean),
                ],
            ),
        };
        k.cfg("Cfg", cfg);
        k.call(format!("{entry}<{}, Cfg>(arena, in0, out)", ctype(*to)));
        k.params(&[KernelParam::Input(0), KernelParam::Output]);
        k.elementwise(n);
        Ok(k.finish())
    }
}
