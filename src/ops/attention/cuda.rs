//! CUDA lowering of flash-style attention and its per-input backwards onto `attention.cu`,
//! and of the rotary position embedding onto `rope.cu`.

use crate::codegen::build::{c_bool, c_f32, c_u64};
use crate::codegen::geometry::u;
use crate::codegen::launch::{templated, Launch};
use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel};
use crate::ir::{AttnInput, AttnParams, Op};
use crate::ops::cuda::CudaLowering;

/// `attention.cu`: the attention forward and the q and k/v backward templates.
const ATTENTION: &str = include_str!("attention.cu");
/// `rope.cu`: the rotary embedding template (INVERSE is its backward).
const ROPE: &str = include_str!("rope.cu");

/// The attention forward (`which` = None) or the gradient of input `which`.
fn attention(a: &Args, p: &AttnParams, which: Option<AttnInput>) -> Result<Kernel, CodegenError> {
    let (q, kt) = (a.at(0)?, a.at(1)?);
    let (b, tq, tk) = (u(q.shape[0]), u(q.shape[1]), u(kt.shape[1]));
    let (h, kvh) = (u(p.heads), u(p.kv_heads));
    let dh = u(q.shape[2]) / h.max(1);
    if dh == 0 || dh > 256 {
        return Err(a.unsupported(format!("head dim {dh} (supported 1..=256)")));
    }
    if h > 65535 || b > 65535 {
        return Err(a.unsupported("more than 65535 heads or batches"));
    }
    // Shared tiles stay within 32 KiB: BT query/key rows, BC keys per K/V tile.
    let bt = (4096 / dh).clamp(16, 64);
    let bc = (4096 / dh).clamp(1, 64);
    let (family, call, rows, heads_grid) = match which {
        None => ("attention", "attention_kernel", tq, h),
        Some(AttnInput::Q) => ("attention_backward_q", "attention_backward_q_kernel", tq, h),
        Some(AttnInput::K) => (
            "attention_backward_k",
            "attention_backward_kv_kernel",
            tk,
            kvh,
        ),
        Some(AttnInput::V) => (
            "attention_backward_v",
            "attention_backward_kv_kernel",
            tk,
            kvh,
        ),
    };
    let lines = vec![
        c_u64("TQ", tq),
        c_u64("TK", tk),
        c_u64("H", h),
        c_u64("KVH", kvh),
        c_u64("DH", dh),
        c_bool("CAUSAL", p.causal),
        c_f32("SCALE", p.scale),
        c_u64("BT", bt),
        c_u64("BC", bc),
        c_bool("WHICH_V", matches!(which, Some(AttnInput::V))),
    ];
    // The backward kernels also read dout (in3).
    let n_in = if which.is_none() { 3 } else { 4 };
    let launch = Launch::Grid(
        [rows.div_ceil(bt), heads_grid, b],
        u32::try_from(bt).unwrap_or(64),
    );
    Ok(templated(
        family,
        &[ATTENTION],
        lines,
        (call, &[a.ty(0)?], n_in),
        launch,
    ))
}

/// Rotary embedding of x = [B, T, heads * hd]: a thread per rotated pair.
fn rope(a: &Args, heads: usize, base: f32, inverse: bool) -> Result<Kernel, CodegenError> {
    let x = a.at(0)?;
    let (b, t, w) = (u(x.shape[0]), u(x.shape[1]), u(x.shape[2]));
    let hd = w / u(heads);
    Ok(templated(
        "rope",
        &[ROPE],
        vec![
            c_u64("ROWS", b * t),
            c_u64("T", t),
            c_u64("HEADS", u(heads)),
            c_u64("HD", hd),
            c_f32("BASE", base),
            c_bool("INVERSE", inverse),
        ],
        ("rope_kernel", &[a.out_ty()], 1),
        Launch::Elementwise(b * t * w / 2),
    ))
}

impl CudaLowering for super::Family {
    /// No kernel of this family reads a workspace.
    fn cuda_workspace_bytes(
        &self,
        _: &crate::ir::Op,
        _: &[&crate::ir::TensorType],
        _: &crate::ir::TensorType,
    ) -> u64 {
        0
    }

    fn lower(&self, a: &Args) -> Result<Kernel, CodegenError> {
        match a.op {
            Op::Attention(p) => attention(a, p, None),
            Op::AttentionBackward { attn, which } => attention(a, attn, Some(*which)),
            Op::Rope {
                heads,
                base,
                inverse,
            } => rope(a, *heads, *base, *inverse),
            _ => Err(a.foreign("attention")),
        }
    }
}
