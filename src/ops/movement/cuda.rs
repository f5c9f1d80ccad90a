//! CUDA lowering of the data-movement ops onto `movement.cu`: reshape, permute and slice as
//! strided gathers (shared with broadcast_to), pad_slice, and concat as one copy per part.

use crate::codegen::build::{c_dims, c_u64, Gen};
use crate::codegen::geometry::{axis_split, contiguous, dims, u};
use crate::codegen::launch::{templated, Launch};
use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel, KernelParam};
use crate::ir::Op;
use crate::ops::cuda::CudaLowering;

impl super::Family {
    /// `movement.cu`: the strided gather, pad_slice and concat templates.
    pub(crate) const TEMPLATE: &'static str = include_str!("movement.cu");

    /// A `gather_kernel` of `family` writing the output (viewed at `dims`) from input 0 read
    /// at `base + sum(index * strides)`, copying elements bit-exactly.
    pub(crate) fn gather(
        a: &Args,
        family: &'static str,
        dims: &[u64],
        strides: &[u64],
        base: u64,
    ) -> Result<Kernel, CodegenError> {
        let n = a.output.numel();
        Ok(templated(
            family,
            &[Self::TEMPLATE],
            vec![
                c_u64("N", n),
                c_u64("BASE", base),
                c_dims("OUT", dims),
                c_dims("SX", strides),
            ],
            ("gather_kernel", &[a.out_ty()], 1),
            Launch::Elementwise(n),
        ))
    }
}

/// Concat along `axis`: one `concat_part` copy per input into its column range.
fn concat(a: &Args, axis: usize) -> Kernel {
    let (_, total, inner) = axis_split(&a.output.shape, axis);
    let mut k = Gen::new("concat", &[super::Family::TEMPLATE]);
    let mut at = 0u64;
    for (i, t) in a.inputs.iter().enumerate() {
        let w = u(t.shape[axis]) * inner;
        k.cfg(
            &format!("Cfg{i}"),
            vec![
                c_u64("N", t.numel()),
                c_u64("WIDTH", w),
                c_u64("TOTAL", total * inner),
                c_u64("AT", at),
            ],
        );
        k.call(format!(
            "concat_part<{}, Cfg{i}>(arena, in{i}, out)",
            a.out_ty()
        ));
        k.params(&[KernelParam::Input(i)]);
        at += w;
    }
    k.params(&[KernelParam::Output]);
    k.elementwise(a.output.numel());
    k.finish()
}

impl CudaLowering for super::Family {
    fn lower(&self, a: &Args) -> Result<Kernel, CodegenError> {
        let out = a.output;
        let n_out = out.numel();
        match a.op {
            Op::Reshape { .. } => Self::gather(a, "reshape", &[n_out], &[1], 0),
            Op::Member { offset, .. } => {
                // The member's elements from the byte where the flat input's `offset` starts
                // (the rules keep that byte aligned to the member's type).
                let base = *offset as u64 * a.at(0)?.dtype.size() / out.dtype.size().max(1);
                Self::gather(a, "member", &[n_out], &[1], base)
            }
            Op::Permute { perm } => {
                let xs = contiguous(&a.at(0)?.shape);
                let st: Vec<u64> = perm.iter().map(|&p| xs[p]).collect();
                Self::gather(a, "permute", &dims(&out.shape), &st, 0)
            }
            Op::Slice { axis, start, .. } => {
                let xs = contiguous(&a.at(0)?.shape);
                let base = u(*start) * xs[*axis];
                Self::gather(a, "slice", &dims(&out.shape), &xs, base)
            }
            Op::PadSlice { axis, start, full } => {
                let x = a.at(0)?;
                let (outer, len, inner) = axis_split(&x.shape, *axis);
                Ok(templated(
                    "pad_slice",
                    &[Self::TEMPLATE],
                    vec![
                        c_u64("N", n_out),
                        c_u64("OUTER", outer),
                        c_u64("LEN", len),
                        c_u64("INNER", inner),
                        c_u64("FULL", u(*full)),
                        c_u64("START", u(*start)),
                    ],
                    ("pad_slice_kernel", &[a.out_ty()], 1),
                    Launch::Elementwise(n_out),
                ))
            }
            Op::Concat { axis } => Ok(concat(a, *axis)),
            _ => Err(a.foreign("movement")),
        }
    }
}
