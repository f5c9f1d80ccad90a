//! CUDA lowering of attention's backward on tensor cores (`attention_backward_mma.cu`) for
//! the operands [`super::cuda::on_tensor_cores`] accepts: two launches of the step's own
//! kernel, the rows' statistics then the gradient, with the statistics (fp32 log-sum-exp and,
//! for dq and dk, `D`, one of each per query row and head) as the step's workspace.

use crate::codegen::build::{c_bool, c_f32, c_u64};
use crate::codegen::gemm::Call;
use crate::codegen::geometry::{region, u};
use crate::codegen::launch::staged;
use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel};
use crate::ir::{AttnInput, AttnParams, TensorType};

/// `attention_backward_mma.cu`.
const TEMPLATE: &str = include_str!("attention_backward_mma.cu");

/// Query rows (dq, statistics) or keys (dk, dv) of a block: four warps of 16.
const BLOCK_ROWS: u64 = 64;

/// The looped tile (keys for dq and the statistics, query rows for dk and dv): 64 rows up to
/// a head dim of 64, 32 beyond, which keeps the kernels within their registers.
fn tile(dh: u64) -> u64 {
    if dh <= 64 {
        64
    } else {
        32
    }
}

/// Byte offset of `D` in the workspace: after one fp32 log-sum-exp per query row and head.
fn d_offset(b: u64, h: u64, tq: u64) -> u64 {
    region(b * h * tq * 4)
}

/// Workspace bytes: the log-sum-exps, then `D` unless the op is dv.
pub(super) fn workspace_bytes(inputs: &[&TensorType], p: &AttnParams, which: AttnInput) -> u64 {
    let Some(q) = inputs.first() else {
        return 0;
    };
    let (b, tq, h) = (u(q.shape[0]), u(q.shape[1]), u(p.heads));
    let lse = d_offset(b, h, tq);
    if which == AttnInput::V {
        lse
    } else {
        2 * lse
    }
}

/// The kernel and its two launches for the gradient of `which`.
pub(super) fn attention_backward_mma(
    a: &Args,
    p: &AttnParams,
    which: AttnInput,
) -> Result<Kernel, CodegenError> {
    let (q, k) = (a.at(0)?, a.at(1)?);
    let (b, tq, tk) = (u(q.shape[0]), u(q.shape[1]), u(k.shape[1]));
    let (h, kvh) = (u(p.heads), u(p.kv_heads));
    let dh = u(q.shape[2]) / h.max(1);
    if h > 65535 || b > 65535 {
        return Err(a.unsupported("more than 65535 heads or batches"));
    }
    let which_code = match which {
        AttnInput::Q => 0,
        AttnInput::K => 1,
        AttnInput::V => 2,
    };
    let mut lines = vec![
        c_u64("TQ", tq),
        c_u64("TK", tk),
        c_u64("H", h),
        c_u64("KVH", kvh),
        c_u64("DH", dh),
        c_bool("CAUSAL", p.causal),
        c_f32("SCALE", p.scale),
        c_u64("BK", tile(dh)),
        c_u64("WHICH", which_code),
        c_u64("DOFF", d_offset(b, h, tq)),
    ];
    lines.extend(super::cuda::masks(p));
    let kernel = staged(
        "attention_backward",
        &[
            super::cuda::ATTENTION,
            super::cuda::MMA,
            super::cuda::ATTENTION_MMA,
            TEMPLATE,
        ],
        lines,
        ("attention_backward_mma_kernel", a.ty(0)?, p.inputs() + 1),
        128,
    );
    let grid = |rows: u64, heads: u64| {
        let blocks = u32::try_from(rows.div_ceil(BLOCK_ROWS)).unwrap_or(u32::MAX);
        [
            blocks,
            u32::try_from(heads).unwrap_or(1),
            u32::try_from(b).unwrap_or(1),
        ]
    };
    let launch = |grid, phase| Call::Launch {
        grid,
        phase,
        chunk: 0,
    };
    let gradient = match which {
        AttnInput::Q => grid(tq, h),
        AttnInput::K | AttnInput::V => grid(tk, kvh),
    };
    let calls = vec![launch(grid(tq, h), 0), launch(gradient, 1)];
    let ws = workspace_bytes(&[q], p, which);
    Ok(kernel.with_library(calls, ws))
}
