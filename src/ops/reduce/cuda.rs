//! CUDA lowering of the broadcast-dim reductions onto `reduce.cu` (sum_to, max_to and the
//! max_to backward) and of broadcast_to, a strided gather of the movement template. A
//! reduction to fewer outputs than an H100 has SMs splits each output's elements into
//! slices, reduced in two stages.

use crate::codegen::build::c_bool;
use crate::codegen::geometry::{bcast_strides, dims, pow2_block, reduce_cfg, slices_workspace};
use crate::codegen::launch::{sliced, templated, Launch};
use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel, KernelParam};
use crate::ir::{Op, TensorType};
use crate::ops::cuda::CudaLowering;

impl super::Family {
    /// `reduce.cu`: the sum/max reduction over broadcast dims and the max_to backward.
    pub(crate) const TEMPLATE: &'static str = include_str!("reduce.cu");

    /// A `reduce_kernel` of `family` reducing input 0 (shape `x`) onto the dims where `keep`
    /// is true, by sum or (`max`) maximum, into the output's type (fp32 for a widened
    /// `sum_to`); one block per output element, fixed order, or, when the outputs are too
    /// few to fill an H100 (`codegen::geometry::slices`), two stages: a block per slice of each output's
    /// elements writes its fp32 partial to the workspace, then a thread per output combines
    /// its slices in order.
    pub(crate) fn reduce(
        a: &Args,
        family: &'static str,
        x: &[usize],
        keep: &[bool],
        max: bool,
    ) -> Result<Kernel, CodegenError> {
        let (mut lines, groups, r) = reduce_cfg(x, keep);
        lines.push(c_bool("MAX", max));
        let call = format!(
            "reduce_kernel<{}, {}, Cfg>(arena, in0, out",
            a.ty(0)?,
            a.out_ty()
        );
        let params = [KernelParam::Input(0), KernelParam::Output];
        let finish = |_, block: u32| groups.div_ceil(u64::from(block));
        let files = (family, &[Self::TEMPLATE][..]);
        Ok(sliced(
            files,
            lines,
            call,
            &params,
            (groups, r, 256),
            finish,
        ))
    }
}

/// The workspace of a reduction of `x` onto the dims where `keep` is true: an fp32 partial
/// per slice when `codegen::geometry::slices` splits its outputs, none otherwise.
fn reduce_workspace(x: &[usize], keep: &[bool]) -> u64 {
    let (_, groups, r) = reduce_cfg(x, keep);
    slices_workspace(groups, r, 4)
}

/// Which dims of `x` survive reducing to `shape`, which `sum_to` may give with fewer dims
/// (the leading ones summed away).
fn summed_to(shape: &[usize], x: &[usize]) -> Vec<bool> {
    let pad = x.len().saturating_sub(shape.len());
    (0..x.len())
        .map(|d| d >= pad && shape[d - pad] == x[d])
        .collect()
}

/// Which dims of `x` survive reducing to `to` (same rank): those of equal extent.
fn kept(to: &[usize], x: &[usize]) -> Vec<bool> {
    to.iter().zip(x).map(|(s, d)| s == d).collect()
}

impl CudaLowering for super::Family {
    /// A `sum_to` or `max_to` split into slices keeps an fp32 partial per slice there.
    fn cuda_workspace_bytes(&self, op: &Op, inputs: &[&TensorType], _: &TensorType) -> u64 {
        let Some(x) = inputs.first() else {
            return 0;
        };
        match op {
            Op::SumTo { shape, .. } => reduce_workspace(&x.shape, &summed_to(shape, &x.shape)),
            Op::MaxTo { shape } => reduce_workspace(&x.shape, &kept(shape, &x.shape)),
            _ => 0,
        }
    }

    fn lower(&self, a: &Args) -> Result<Kernel, CodegenError> {
        match a.op {
            Op::SumTo { shape, .. } => {
                let x = a.at(0)?;
                Self::reduce(a, "sum_to", &x.shape, &summed_to(shape, &x.shape), false)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn few_outputs_of_many_elements_reduce_in_slices() {
        // 5 column sums of 2,100 rows: 3 slices each, an fp32 partial per slice.
        assert_eq!(
            reduce_workspace(&[2100, 5], &summed_to(&[5], &[2100, 5])),
            60
        );
        // GPT-2's bias gradients (768 columns of 8,192 rows) fill an H100 unsplit.
        assert_eq!(
            reduce_workspace(&[8, 1024, 768], &summed_to(&[768], &[8, 1024, 768])),
            0
        );
        // A leading dim summed away, the kept one in the middle.
        assert_eq!(summed_to(&[3, 1], &[2, 3, 4]), vec![false, true, false]);
    }
}
