//! CPU reference kernels of the movement ops (reshape, a member of a flat tensor, permute,
//! slice, its zero-padding inverse, concatenation).

mod kernels;

use crate::exec::cpu::CpuStep;
use crate::exec::{lowp, ExecError};
use crate::ir::{Op, TensorType};
use crate::ops::cpu::{foreign_op, CpuKernel};

impl CpuKernel for super::Family {
    fn run_cpu(&self, step: &CpuStep) -> Result<(), ExecError> {
        let (x, s, out) = (|i| step.input(i), |i| step.shape(i), step.output());
        match step.op() {
            Op::Reshape { .. } => out.copy_from_slice(x(0)),
            Op::Member {
                offset,
                dtype: None,
                ..
            } => out.copy_from_slice(&x(0)[*offset..][..out.len()]),
            Op::Member {
                offset,
                dtype: Some(t),
                ..
            } => {
                // Only the flat input's elements the member's bytes lie in are encoded.
                let from = step.dtype(0);
                let len = out.len() * t.size() as usize;
                let covering = len.div_ceil(from.size() as usize);
                let bytes = lowp::to_bytes(from, &x(0)[*offset..*offset + covering]);
                out.copy_from_slice(&lowp::from_bytes(*t, &bytes[..len]));
            }
            Op::Permute { perm } => kernels::permute(x(0), s(0), perm, out),
            Op::Slice { axis, start, end } => kernels::slice(x(0), s(0), *axis, *start, *end, out),
            Op::PadSlice { axis, start, full } => {
                kernels::pad_slice(x(0), s(0), *axis, *start, *full, out)
            }
            Op::Concat { axis } => {
                let parts: Vec<(&[f32], &[usize])> =
                    (0..step.input_count()).map(|i| (x(i), s(i))).collect();
                kernels::concat(&parts, *axis, out)
            }
            op => return Err(foreign_op(op, "movement")),
        }
        Ok(())
    }

    fn cpu_workspace_bytes(&self, _: &Op, _: &[&TensorType], _: &TensorType) -> u64 {
        0
    }
}
