//! CUDA lowering of attention's backward on tensor cores (`attention_backward_mma.cu`) for
//! the operands [`super::cuda::on_tensor_cores`] accepts: the rows' statistics then the
//! gradient, with the statistics (fp32 log-sum-exp and, for dq and dk, `D`, one of each per
//! query row and head) as the step's workspace; dq in one launch (each block's query rows
//! are the rows whose statistics it computes), dk and dv in two. The packed backward
//! computes the statistics with `D` and dq in one launch, then dk and dv: two launches up to
//! a head dim of 64 (dk and dv together), three beyond.

use crate::codegen::build::c_u64;
use crate::codegen::gemm::Call;
use crate::codegen::geometry::{region, u, SMS};
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

/// Blocks of 64 keys of every kv head and batch item at or past which dk and dv fill an
/// H100 unsplit; fewer split each one's query tiles over up to this many blocks in all.
fn dkv_splits(b: u64, tq: u64, tk: u64, kvh: u64, dh: u64) -> u64 {
    let units = tk.div_ceil(BLOCK_ROWS) * kvh * b;
    if units == 0 || units >= SMS {
        return 1;
    }
    SMS.div_ceil(units).min(tq.div_ceil(tile(dh))).max(1)
}

/// Workspace bytes: the log-sum-exps, then `D` unless the op is dv, then for dk or dv split
/// over query tiles ([`dkv_splits`]) an fp32 partial gradient per split.
pub(super) fn workspace_bytes(inputs: &[&TensorType], p: &AttnParams, which: AttnInput) -> u64 {
    let Some(q) = inputs.first() else {
        return 0;
    };
    let (b, tq, h, kvh) = (u(q.shape[0]), u(q.shape[1]), u(p.heads), u(p.kv_heads));
    let stats = stats_bytes(b, h, tq, which);
    let dh = u(q.shape[2]).checked_div(h).unwrap_or(0);
    match (which, inputs.get(1)) {
        (AttnInput::K | AttnInput::V, Some(k)) => {
            let tk = u(k.shape[1]);
            match dkv_splits(b, tq, tk, kvh, dh) {
                1 => stats,
                n => stats + region(n * b * kvh * tk * dh * 4),
            }
        }
        _ => stats,
    }
}

/// Bytes of the row statistics: the log-sum-exps, then `D` unless the op is dv.
fn stats_bytes(b: u64, h: u64, tq: u64, which: AttnInput) -> u64 {
    let lse = d_offset(b, h, tq);
    if which == AttnInput::V {
        lse
    } else {
        2 * lse
    }
}

/// The kernel of `a`'s backward on tensor cores (entry `entry` of `n_in` inputs, with the
/// `Cfg` lines `extra` beyond the shapes), its launches, `(phase, blocks, heads)` each:
/// `blocks` of each of `heads` heads of each batch item, and its workspace bytes `ws`.
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
        c_u64("B", b),
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
        .map(|(phase, blocks, heads)| Call::Launch {
            grid: [
                u32::try_from(blocks).unwrap_or(u32::MAX),
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

/// The kernel and its launches for the gradient of `which`: the statistics, then the
/// gradient (dq in the statistics' launch, its blocks' rows being theirs), then, for dk or
/// dv split over query tiles ([`dkv_splits`]), the sum of the splits' partials.
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
    let (s, _) = super::cuda::shapes(a, p)?;
    let splits = match which {
        AttnInput::Q => 1,
        AttnInput::K | AttnInput::V => dkv_splits(s.b, s.tq, s.tk, s.kvh, s.dh),
    };
    let lines = vec![
        c_u64("WHICH", which_code),
        c_u64("QSPLIT", splits),
        c_u64("POFF", stats_bytes(s.b, s.h, s.tq, which)),
    ];
    let ws = workspace_bytes(&[a.at(0)?, a.at(1)?], p, which);
    lower(a, p, entry, (lines, ws), |s| {
        let mut launches = vec![(0, s.tq.div_ceil(BLOCK_ROWS), s.h)];
        if which != AttnInput::Q {
            launches.push((1, s.tk.div_ceil(BLOCK_ROWS) * splits, s.kvh));
        }
        if splits > 1 {
            launches.push((2, (s.tk * s.dh).div_ceil(128), s.kvh));
        }
        launches
    })
}

/// The largest head dim whose dk and dv one launch of the packed backward computes together
/// (sharing each tile's scores and probabilities): two gradient accumulators beside the
/// keys' and values' fragments fit a thread's registers up to here without spilling.
const DKV_TOGETHER_MAX_DH: u64 = 64;

/// The packed backward's kernel and its launches: the statistics with `D` and dq in one,
/// then dk and dv into their blocks of `dx`, together in one launch up to
/// [`DKV_TOGETHER_MAX_DH`] (two launches), else one each (three).
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
    let lines = vec![
        c_u64("DKV", u64::from(together)),
        c_u64("QSPLIT", 1),
        c_u64("POFF", 0),
    ];
    lower(a, p, entry, (lines, ws), |s| {
        let (rows, keys) = (s.tq.div_ceil(BLOCK_ROWS), s.tk.div_ceil(BLOCK_ROWS));
        let mut launches = vec![(0, rows, s.h), (2, keys, s.kvh)];
        if !together {
            launches.push((3, keys, s.kvh));
        }
        launches
    })
}

/// Workspace bytes of the packed backward: the log-sum-exps and `D`, once for all three
/// gradients (its dk and dv are not split).
pub(super) fn packed_workspace_bytes(inputs: &[&TensorType], p: &AttnParams) -> u64 {
    workspace_bytes(inputs, p, AttnInput::Q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dk_and_dv_over_few_keys_split_the_query_tiles() {
        // The SD UNet's cross-attention: 77 text keys (2 blocks) of 8 heads of 4 samples
        // under 1,024 query rows of 80 dims take 3 splits (192 blocks).
        assert_eq!(dkv_splits(4, 1024, 77, 8, 80), 3);
        // No more splits than query tiles: 100 rows of 64 dims are 2 tiles.
        assert_eq!(dkv_splits(1, 100, 40, 1, 64), 2);
        // GPT-2 small (16 key blocks x 12 heads x 8 samples) fills unsplit.
        assert_eq!(dkv_splits(8, 1024, 1024, 12, 64), 1);
        // The partials follow the statistics in the workspace.
        let p = AttnParams {
            heads: 2,
            kv_heads: 1,
            causal: false,
            scale: 0.125,
            window: None,
            softcap: None,
            key_mask: false,
        };
        let q = TensorType::new(crate::ir::DType::BF16, vec![1, 300, 64]);
        let k = TensorType::new(crate::ir::DType::BF16, vec![1, 40, 32]);
        let stats = stats_bytes(1, 2, 300, AttnInput::V);
        let split = region(5 * 40 * 32 * 4);
        assert_eq!(workspace_bytes(&[&q, &k], &p, AttnInput::V), stats + split);
        assert_eq!(workspace_bytes(&[&q, &k], &p, AttnInput::Q), 2 * stats);
    }
}
