//! CUDA lowering of flash-style attention onto `attention.cu` (its backwards, GEMMs on
//! cuBLASLt, are in `backward_cuda.rs`), and of the rotary position embedding onto `rope.cu`.

use crate::codegen::build::{c_bool, c_f32, c_u64};
use crate::codegen::geometry::{u, SMS};
use crate::codegen::launch::{templated, Launch};
use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel};
use crate::ir::{AttnParams, DType, Op, TensorType};
use crate::ops::cuda::CudaLowering;

/// `attention.cu`: the attention forward template.
pub(super) const ATTENTION: &str = include_str!("attention.cu");
/// `mma.cu`: the tensor-core primitive and fragment loads of the MMA kernels.
pub(super) const MMA: &str = include_str!("mma.cu");
/// `attention_mma.cu`: the tensor-core forward for 16-bit operands (after `attention.cu` and
/// `mma.cu`).
pub(super) const ATTENTION_MMA: &str = include_str!("attention_mma.cu");
/// Query rows of a tensor-core forward block (four warps of 16) and its keys per tile.
const MMA_ROWS: u64 = 64;
const MMA_KEYS: u64 = 64;
/// `rope.cu`: the rotary embedding template (INVERSE is its backward).
const ROPE: &str = include_str!("rope.cu");

/// `WINDOW`, the sliding window of a causal mask (0 for none), `KEY_MASK`, whether a key
/// mask is read, and `SOFTCAP`, the scores' soft cap (0 for none): the lines both templates
/// share beyond the shapes.
pub(super) fn masks(p: &AttnParams) -> [String; 3] {
    [
        c_u64("WINDOW", p.window.map_or(0, u)),
        c_bool("KEY_MASK", p.key_mask),
        c_f32("SOFTCAP", p.softcap.unwrap_or(0.0)),
    ]
}

/// Whether the forward of head dim `dh` over `dtype` operands runs on tensor cores
/// (`attention_mma.cu`): 16-bit operands, a head dim that is a multiple of 16 up to 128.
pub(super) fn on_tensor_cores(dtype: DType, dh: u64) -> bool {
    matches!(dtype, DType::BF16 | DType::F16) && dh.is_multiple_of(16) && (16..=128).contains(&dh)
}

/// Whether `op` reads q, k and v as the column blocks of one packed operand.
pub(super) fn packed(op: &Op) -> bool {
    matches!(op, Op::PackedAttention(_) | Op::PackedAttentionBackward(_))
}

/// `QROW` and `KVROW`, the row strides (elements) of q and of k and v: their widths, or both
/// the packed operand's.
pub(super) fn row_strides(a: &Args) -> Result<[String; 2], CodegenError> {
    let kv = a.at(usize::from(!packed(a.op)))?;
    Ok([
        c_u64("QROW", u(a.at(0)?.shape[2])),
        c_u64("KVROW", u(kv.shape[2])),
    ])
}

/// The types of q and k of an attention op: its first two inputs, or the first two blocks of
/// its packed operand.
pub(super) fn operand_types(a: &Args, p: &AttnParams) -> Result<[TensorType; 2], CodegenError> {
    if !packed(a.op) {
        return Ok([a.at(0)?.clone(), a.at(1)?.clone()]);
    }
    let [q, k, _] = super::rules::unpacked(a.at(0)?, p).map_err(|e| a.err(e.message))?;
    Ok([q, k])
}

/// The shapes of an attention op's kernels: batch, query and key rows, heads, kv heads and
/// head dim.
pub(super) struct Shapes {
    pub(super) b: u64,
    pub(super) tq: u64,
    pub(super) tk: u64,
    pub(super) h: u64,
    pub(super) kvh: u64,
    pub(super) dh: u64,
}

/// The shapes of `a`'s attention op ([`operand_types`]) and the `Cfg` lines every attention
/// kernel reads (shapes, the row strides `QROW` of q and `KVROW` of k and v, causal mask,
/// scale, [`masks`]); `Unsupported` for a head
/// dim outside 1..=256 or a grid past CUDA's 65,535 heads or batches.
pub(super) fn shapes(a: &Args, p: &AttnParams) -> Result<(Shapes, Vec<String>), CodegenError> {
    let [q, kt] = operand_types(a, p)?;
    let (b, tq, tk) = (u(q.shape[0]), u(q.shape[1]), u(kt.shape[1]));
    let (h, kvh) = (u(p.heads), u(p.kv_heads));
    let dh = u(q.shape[2]) / h.max(1);
    if dh == 0 || dh > 256 {
        return Err(a.unsupported(format!("head dim {dh} (supported 1..=256)")));
    }
    if h > 65535 || b > 65535 {
        return Err(a.unsupported("more than 65535 heads or batches"));
    }
    let mut lines = vec![
        c_u64("TQ", tq),
        c_u64("TK", tk),
        c_u64("H", h),
        c_u64("KVH", kvh),
        c_u64("DH", dh),
        c_bool("CAUSAL", p.causal),
        c_f32("SCALE", p.scale),
    ];
    lines.extend(row_strides(a)?);
    lines.extend(masks(p));
    Ok((
        Shapes {
            b,
            tq,
            tk,
            h,
            kvh,
            dh,
        },
        lines,
    ))
}

/// The attention forward, of separate or packed operands: on tensor cores where [`on_tensor_cores`] says so, else the SIMT
/// kernel of `attention.cu`.
fn attention(a: &Args, p: &AttnParams) -> Result<Kernel, CodegenError> {
    let (Shapes { b, tq, h, dh, .. }, mut lines) = shapes(a, p)?;
    let (prefix, n_in) = if packed(a.op) {
        ("packed_", p.packed_inputs())
    } else {
        ("", p.inputs())
    };
    if on_tensor_cores(a.at(0)?.dtype, dh) {
        lines.push(c_u64("BK", MMA_KEYS));
        let launch = Launch::Grid([tq.div_ceil(MMA_ROWS), h, b], 128);
        return Ok(templated(
            "attention",
            &[ATTENTION, MMA, ATTENTION_MMA],
            lines,
            (&format!("{prefix}attention_mma_kernel"), &[a.ty(0)?], n_in),
            launch,
        ));
    }
    // Shared tiles stay within 33 KiB: BT query rows (padded by a float, a multiple of 8),
    // BC keys per K/V tile; fewer rows a block (down to 8) where the tiles of every head
    // would not fill an H100 (each thread keeps its own row: the values do not depend on BT).
    let fill = tq.div_ceil(SMS.div_ceil((h * b).max(1)));
    let bt = ((4096 / dh).clamp(16, 64).min(fill) / 8).max(1) * 8;
    let bc = (2048 / dh).clamp(1, 64);
    lines.extend([c_u64("BT", bt), c_u64("BC", bc)]);
    let launch = Launch::Grid([tq.div_ceil(bt), h, b], u32::try_from(bt).unwrap_or(64));
    Ok(templated(
        "attention",
        &[ATTENTION],
        lines,
        (&format!("{prefix}attention_kernel"), &[a.ty(0)?], n_in),
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
    /// The backward's scores and cuBLASLt's scratch (`backward_cuda::workspace_bytes`);
    /// the forward and rope read none.
    fn cuda_workspace_bytes(
        &self,
        op: &crate::ir::Op,
        inputs: &[&crate::ir::TensorType],
        _: &crate::ir::TensorType,
    ) -> u64 {
        match op {
            Op::AttentionBackward { attn, which } => {
                super::backward_cuda::workspace_bytes(inputs, attn, *which)
            }
            Op::PackedAttentionBackward(attn) => {
                super::backward_cuda::packed_workspace_bytes(inputs, attn)
            }
            _ => 0,
        }
    }

    fn lower(&self, a: &Args) -> Result<Kernel, CodegenError> {
        match a.op {
            Op::Attention(p) | Op::PackedAttention(p) => attention(a, p),
            Op::AttentionBackward { attn, which } => {
                super::backward_cuda::attention_backward(a, attn, *which)
            }
            Op::PackedAttentionBackward(attn) => {
                super::backward_cuda::packed_attention_backward(a, attn)
            }
            Op::Rope {
                heads,
                base,
                inverse,
            } => rope(a, *heads, *base, *inverse),
            _ => Err(a.foreign("attention")),
        }
    }
}
