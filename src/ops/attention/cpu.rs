//! CPU reference kernels of the attention ops (scaled dot-product attention and its
//! backwards, rotary position embedding).

mod kernels;
mod packed;
mod rope;

use crate::exec::cpu::CpuStep;
use crate::exec::ExecError;
use crate::ir::{AttnParams, Op, TensorType};
use crate::ops::cpu::{foreign_op, CpuKernel};
use kernels::{AttnGeom, Operands};

/// Geometry of an attention from its params and q and k shapes (`[b, t, width]`).
fn attn_geom(a: &AttnParams, q: &[usize], k: &[usize], operand: crate::ir::DType) -> AttnGeom {
    AttnGeom {
        b: q[0],
        t_q: q[1],
        t_k: k[1],
        attn: *a,
        head_dim: q[2] / a.heads.max(1),
        operand,
    }
}

/// Geometry of a packed attention from its params and the shape of `x`
/// (`[b, t, (heads + 2 kv_heads) * head_dim]`).
fn packed_geom(a: &AttnParams, x: &[usize], operand: crate::ir::DType) -> AttnGeom {
    AttnGeom {
        b: x[0],
        t_q: x[1],
        t_k: x[1],
        attn: *a,
        head_dim: x[2] / (a.heads + 2 * a.kv_heads).max(1),
        operand,
    }
}

/// q, k, v (the step's first inputs) and the key mask, input `mask_at`, when `a` reads one.
fn operands<'a>(step: &CpuStep<'a>, a: &AttnParams, mask_at: usize) -> Operands<'a> {
    Operands {
        q: step.input(0),
        k: step.input(1),
        v: step.input(2),
        mask: a.key_mask.then(|| step.ids(mask_at)),
    }
}

impl CpuKernel for super::Family {
    fn run_cpu(&self, step: &CpuStep) -> Result<(), ExecError> {
        let (x, s, out) = (|i| step.input(i), |i| step.shape(i), step.output());
        match step.op() {
            Op::Attention(a) => kernels::attention_forward(
                &attn_geom(a, s(0), s(1), step.dtype(0)),
                operands(step, a, 3),
                out,
            ),
            Op::AttentionBackward { attn, which } => kernels::attention_backward(
                &attn_geom(attn, s(0), s(1), step.dtype(0)),
                operands(step, attn, 4),
                x(3),
                *which,
                out,
            ),
            Op::PackedAttention(a) => packed::packed_forward(
                &packed_geom(a, s(0), step.dtype(0)),
                x(0),
                a.key_mask.then(|| step.ids(1)),
                out,
            ),
            Op::PackedAttentionBackward(a) => packed::packed_backward(
                &packed_geom(a, s(0), step.dtype(0)),
                x(0),
                a.key_mask.then(|| step.ids(2)),
                x(1),
                out,
            ),
            Op::Rope {
                heads,
                base,
                inverse,
            } => {
                let sh = s(0);
                let head_dim = sh[2] / heads.max(&1);
                rope::rope(x(0), sh[0], sh[1], *heads, head_dim, *base, *inverse, out)
            }
            op => return Err(foreign_op(op, "attention")),
        }
        Ok(())
    }

    fn cpu_workspace_bytes(&self, _: &Op, _: &[&TensorType], _: &TensorType) -> u64 {
        0
    }
}
