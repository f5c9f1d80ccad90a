//! CUDA lowering of the broadcast-dim reductions onto `reduce.cu` (sum_to, max_to and the
//! max_to backward) and of broadcast_to, a strided gather of the movement template.

use crate::codegen::build::c_bool;
use crate::codegen::geometry::{bcast_strides, dims, pow2_block, reduce_cfg};
use crate::codegen::launch::{templated, Launch};
use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel};
use crate::ir::Op;
use crate::ops::cuda::CudaLowering;

impl super::Family {
    /// `reduce.cu`: the sum/max reduction over broadcast dims and the max_to backward.
    pub(crate) const TEMPLATE: &'static str = include_str!("reduce.cu");

    /// A `reduce_kernel` of `family` reducing input 0 (shape `x`) onto the dims where `keep`
    /// is true, by sum or (`max`) maximum, into the output's type (fp32 for a widened
    /// `sum_to`); one block per output element, fixed order.
    pub(crate) fn reduce(
        a: &Args,
        family: &'static str,
        x: &[usize],
        keep: &[bool],
        max: bool,
    ) -> Result<Kernel, CodegenError> {
        let (mut lines, groups, r) = reduce_cfg(x, keep);
        lines.push(c_bool("MAX", max));
        Ok(templated(
            family,
            &[Self::TEMPLATE],
            lines,
            ("reduce_kernel", &[a.ty(0)?, a.out_ty()], 1),
            Launch::PerBlock(groups, pow2_block(r, 32, 256)),
        ))
    }
}

/// Which dims of `x` survive reducing to `to` (same rank): those of equal extent.
fn kept(to: &[usize], x: &[usize]) -> Vec<bool> {
    to.iter().zip(x).map(|(s, d)| s == d).collect()
}

impl CudaLowering for super::Family {
    fn lower(&self, a: &Args) -> Result<Kernel, CodegenError> {
        match a.op {
            Op::SumTo { shape, .. } => {
                let x = a.at(0)?;
                let pad = x.shape.len().saturating_sub(shape.len());
                let keep: Vec<bool> = (0..x.shape.len())
                    .map(|d| d >= pad && shape[d - pad] == x.shape[d])
                    .collect();
                Self::reduce(a, "sum_to", &x.shape, &keep, false)
            }
            Op::MaxTo { shape } => {
                let x = a.at(0)?;
                Self::reduce(a, "max_to", &x.shape, &kept(shape, &x.shape), true)
            }
            Op::MaxToBackward => {
                let (x, y) = (a.at(0)?, a.at(1)?);
                let (lines, groups, r) = reduce_cfg(&x.shape, &kept(&y.shape, &x.shape));
                Ok(templated(
                    "max_to_backward",
                    &[Self::TEMPLATE],
                    lines,
                    ("max_to_backward_kernel", &[a.ty(0)?, a.ty(1)?, a.ty(2)?], 3),
                    Launch::PerBlock(groups, pow2_block(r, 32, 256)),
                ))
            }
            Op::BroadcastTo { shape } => {
                let strides = bcast_strides(&a.at(0)?.shape, shape);
                crate::ops::movement::Family::gather(a, "broadcast_to", &dims(shape), &strides, 0)
            }
            _ => Err(a.foreign("reduce")),
        }
    }
}
