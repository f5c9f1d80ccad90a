//! CUDA lowering of attention's backward on tensor cores (`attention_backward_mma.cu`) for
//! the operands [`super::cuda::on_tensor_cores`] accepts: two launches of the step's own
//! kernel, the rows' statistics then the gradient, with the statistics (fp32 log-sum-exp and,
//! for dq and dk, `D`, one of each per query row and head) as the step's workspace.

use crate::codegen::build::c_u64;
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
    let (
        super::cuda::Shapes {
            b,
            tq,
            tk,
            h,
            kvh,
            dh,
        },
        mut lines,
    ) = super::cuda::shapes(a, p)?;
    let which_code = match which {
        AttnInput::Q => 0,
        AttnInput::K => 1,
        AttnInput::V => 2,
    };
    lines.extend([
        c_u64("BK", tile(dh)),
        c_u64("WHICH", which_code),
        c_u64("DOFF", d_offset(b, h, tq)),
    ]);
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
    let ws = workspace_bytes(&[a.at(0)?], p, which);
    Ok(kernel.with_library(calls, ws))
}
