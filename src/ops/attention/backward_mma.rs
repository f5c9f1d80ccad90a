//! CUDA lowering of attention's backward on tensor cores (`attention_backward_mma.cu`) for
//! the operands [`super::cuda::on_tensor_cores`] accepts: two launches of the step's own
//! kernel, the rows' statistics then the gradient, with the statistics (fp32 log-sum-exp and,
//! for dq and dk, `D`, one of each per query row and head) as the step's workspace. The packed
//! backward computes the statistics with `D` once, then dq, then dk and dv: three launches
//! up to a head dim of 64 (dk and dv together), four beyond.

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

/// The kernel of `a`'s backward on tensor cores (entry `entry` of `n_in` inputs, with the
/// `Cfg` lines `extra` beyond the shapes), its launches, `(phase, rows, heads)` each: a
/// block per 64 of `rows` of each of `heads` heads of each batch item, and its workspace
/// bytes `ws`.
fn lower(
    a: &Args,
    p: &AttnParams,
    (entry, n_in): (&str, usize),
    (extra, ws): (Vec<String>, u64),
    launches: impl Fn(&super::cuda::Shapes) -> Vec<(u64, u64, u64)>,
) -> Result<Kernel, CodegenError> {
    let (shapes, mut lines) = super::cuda::shapes(a, p)?;
    let (b, tq, h) = (shapes.b, shapes.tq, shapes.h);
    lines.extend([
        c_u64("BK", tile(shapes.dh)),
        c_u64("DOFF", d_offset(b, h, tq)),
    ]);
    lines.extend(extra);
    let kernel = staged(
        "attention_backward",
        &[
            super::cuda::ATTENTION,
            super::cuda::MMA,
            super::cuda::ATTENTION_MMA,
            TEMPLATE,
        ],
        lines,
        (entry, a.ty(0)?, n_in),
        128,
    );
    let calls = launches(&shapes)
        .into_iter()
        .map(|(phase, rows, heads)| Call::Launch {
            grid: [
                u32::try_from(rows.div_ceil(BLOCK_ROWS)).unwrap_or(u32::MAX),
                u32::try_from(heads).unwrap_or(1),
                u32::try_from(b).unwrap_or(1),
            ],
            phase,
            chunk: 0,
            finishes: false,
        })
        .collect();
    Ok(kernel.with_library(calls, ws))
}

/// The kernel and its two launches for the gradient of `which`.
pub(super) fn attention_backward_mma(
    a: &Args,
    p: &AttnParams,
    which: AttnInput,
) -> Result<Kernel, CodegenError> {
    let entry = ("attention_backward_mma_kernel", p.inputs() + 1);
    let which_code = match which {
        AttnInput::Q => 0,
        AttnInput::K => 1,
        AttnInput::V => 2,
    };
    let lines = vec![c_u64("WHICH", which_code)];
    let ws = workspace_bytes(&[a.at(0)?], p, which);
    lower(a, p, entry, (lines, ws), |s| {
        let gradient = match which {
            AttnInput::Q => (1, s.tq, s.h),
            AttnInput::K | AttnInput::V => (1, s.tk, s.kvh),
        };
        vec![(0, s.tq, s.h), gradient]
    })
}

/// The largest head dim whose dk and dv one launch of the packed backward computes together
/// (sharing each tile's scores and probabilities): two gradient accumulators beside the
/// keys' and values' fragments fit a thread's registers up to here without spilling.
const DKV_TOGETHER_MAX_DH: u64 = 64;

/// The packed backward's kernel and its launches: the statistics with `D`, then dq, then dk
/// and dv into their blocks of `dx`, together in one launch up to
/// [`DKV_TOGETHER_MAX_DH`] (three launches), else one each (four).
pub(super) fn packed_attention_backward_mma(
    a: &Args,
    p: &AttnParams,
) -> Result<Kernel, CodegenError> {
    let entry = (
        "packed_attention_backward_mma_kernel",
        p.packed_inputs() + 1,
    );
    let ws = packed_workspace_bytes(&[a.at(0)?], p);
    let together = super::cuda::shapes(a, p)?.0.dh <= DKV_TOGETHER_MAX_DH;
    let lines = vec![c_u64("DKV", u64::from(together))];
    lower(a, p, entry, (lines, ws), |s| {
        let mut launches = vec![(0, s.tq, s.h), (1, s.tq, s.h), (2, s.tk, s.kvh)];
        if !together {
            launches.push((3, s.tk, s.kvh));
        }
        launches
    })
}

/// Workspace bytes of the packed backward: the log-sum-exps and `D`, once for all three
/// gradients.
pub(super) fn packed_workspace_bytes(inputs: &[&TensorType], p: &AttnParams) -> u64 {
    workspace_bytes(inputs, p, AttnInput::Q)
}
