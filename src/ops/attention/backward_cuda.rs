//! CUDA lowering of attention's backward (one op per gradient) where it does not run on
//! tensor cores in its own kernels (`backward_mma.rs`: 16-bit operands, head dims a multiple
//! of 16 up to 128): cuBLASLt GEMMs around the elementwise stages of `attention_backward.cu`. Per unit of query heads
//! and query rows: `s = SCALE q k^T` (GEMM), `p = softmax(s)`; then `dv += p^T dout`, or
//! `dp = dout v^T` (GEMM), `ds = SCALE p (dp - D)`, and `dq = ds k` or `dk += ds^T q`. The
//! scores of one unit live in the workspace, which is bounded by [`SCRATCH`]: units are as
//! many heads (and, when one head's rows exceed it, as few query rows) as fit. Key
//! gradients summed over several units (row chunks, or a group's query heads) accumulate in
//! fp32 in the workspace and are stored once. With a sliding window, units are chunks of
//! about a window of rows, and each unit's GEMMs span only the keys its rows see
//! ([`AttnParams::visible_keys`]), so the work and the scores grow as T x W, not T x T; the
//! accumulator is zeroed first, since no unit covers every key. A key mask zeroes the
//! probabilities of the keys it hides in the softmax stage; the GEMMs still span them. A soft
//! cap is applied to `s` in the softmax stage, which for dq and dk also keeps its slope
//! `1 - tanh²(s / C)` in the workspace for `ds` to multiply by.

use crate::codegen::build::{c_bool, c_f32, c_u64};
use crate::codegen::gemm::{Addr, Call, Gemm};
use crate::codegen::geometry::{padded_row, region, u};
use crate::codegen::launch::staged;
use crate::codegen::ops::Args;
use crate::codegen::{CodegenError, Kernel};
use crate::ir::{AttnInput, AttnParams, DType, TensorType};
use crate::ops::matmul::GEMM_WORKSPACE;

/// `attention_backward.cu`: the stages between the GEMMs.
const TEMPLATE: &str = include_str!("attention_backward.cu");

/// Bytes of scores (and their gradients) one unit may hold.
pub(crate) const SCRATCH: u64 = 64 << 20;

/// Threads of the row and store launches.
const BLOCK: u32 = 256;

/// The fewest query rows of a windowed unit, so that short windows still give GEMMs of a
/// useful size.
const WINDOW_ROWS: u64 = 64;

/// The geometry of one attention backward and its workspace layout.
struct Geometry {
    b: u64,
    tq: u64,
    tk: u64,
    h: u64,
    kvh: u64,
    dh: u64,
    /// Elements between the starts of consecutive score rows in the workspace.
    tk_ld: u64,
    /// Whether the key gradients sum over units in the fp32 accumulator.
    accumulates: bool,
    dtype: DType,
    /// Query heads and query rows per unit.
    hc: u64,
    rc: u64,
    /// Byte offsets of p (in T), dp (fp32), ds (in T), the soft cap's slopes (fp32, empty
    /// unless dq or dk has a cap), the accumulator, and cuBLASLt's scratch.
    regions: [u64; 6],
}

impl Geometry {
    fn of(inputs: &[&TensorType], p: &AttnParams, which: AttnInput) -> Option<Geometry> {
        let (q, k) = (inputs.first()?, inputs.get(1)?);
        let (b, tq, tk) = (u(q.shape[0]), u(q.shape[1]), u(k.shape[1]));
        let (h, kvh) = (u(p.heads), u(p.kv_heads));
        let dh = u(q.shape[2]).checked_div(h)?;
        let e = q.dtype.size();
        // Bytes per score: s/p in fp32 and p in T; for dq and dk also dp (fp32) and ds (T).
        let slopes = p.softcap.is_some() && which != AttnInput::V;
        let per = if which == AttnInput::V {
            4 + e
        } else {
            2 * (4 + e) + if slopes { 4 } else { 0 }
        };
        // Rows per unit and the keys they see: all of them, or with a window W, chunks of
        // rows that see at most rows + W - 1 keys.
        let window = p.window.map(u);
        let rows = window.map_or(tq, |w| tq.min(w.max(WINDOW_ROWS)));
        let keys = |rows: u64| window.map_or(tk, |w| tk.min(rows + w - 1));
        let row_bytes = padded_row(keys(rows)) * per;
        // Chunks of equal rows (but the last, by at most one row less) within the scratch: a
        // remainder chunk of a few rows would launch a few blocks.
        let rc = if rows * row_bytes <= SCRATCH {
            rows
        } else {
            let most = (SCRATCH / row_bytes.max(1)).clamp(1, tq);
            tq.div_ceil(tq.div_ceil(most))
        };
        let tk_ld = padded_row(keys(rc));
        let hc = if h == kvh {
            (SCRATCH / (rc * tk_ld * per).max(1)).clamp(1, h)
        } else {
            1
        };
        let scores = hc * rc * tk_ld;
        let p_at = region(scores * 4);
        let dp_at = p_at + region(scores * e);
        let ds_at = if which == AttnInput::V {
            dp_at
        } else {
            dp_at + region(scores * 4)
        };
        let slope_at = if which == AttnInput::V {
            dp_at
        } else {
            ds_at + region(scores * e)
        };
        let acc_at = slope_at + if slopes { region(scores * 4) } else { 0 };
        let accumulates = which != AttnInput::Q && (h != kvh || rc < tq || p.window.is_some());
        let scratch_at = acc_at
            + if accumulates {
                region(hc * tk * dh * 4)
            } else {
                0
            };
        Some(Geometry {
            b,
            tq,
            tk,
            h,
            kvh,
            dh,
            tk_ld,
            accumulates,
            dtype: q.dtype,
            hc,
            rc,
            regions: [p_at, dp_at, ds_at, slope_at, acc_at, scratch_at],
        })
    }

    /// Byte offset of head `h` of query row `r` of batch item `b` in rows of `row` elements.
    fn at_q(&self, b: u64, r: u64, h: u64, row: u64) -> u64 {
        ((b * self.tq + r) * row + h * self.dh) * self.dtype.size()
    }

    /// Byte offset of kv head `g` of key `j` of batch item `b` in rows of `row` elements.
    fn at_kv(&self, b: u64, j: u64, g: u64, row: u64) -> u64 {
        ((b * self.tk + j) * row + g * self.dh) * self.dtype.size()
    }

    /// The first key of the score rows of the unit of query rows `r0..r0 + rn`, and how many
    /// keys they hold: with a window, those the rows see (at least one, so that every GEMM
    /// has a size); else all of them. `attb_keys` of `attention_backward.cu` computes the same.
    fn keys(&self, p: &AttnParams, r0: u64, rn: u64) -> (u64, u64) {
        if p.window.is_none() {
            return (0, self.tk);
        }
        let (tq, tk) = (self.tq as usize, self.tk as usize);
        let first = p.visible_keys(r0 as usize, tq, tk).start;
        let end = p.visible_keys((r0 + rn - 1) as usize, tq, tk).end;
        (u(first), u(end.max(first + 1) - first))
    }
}

/// Where a backward's GEMMs find their operands and put the gradient: the input and byte
/// offset (its first column) of q, k and v, the input of dout (rows of its own heads), the
/// row strides of q and of k and v in elements, the gradient's first column (bytes) and row
/// stride in the output, and the phase that stores accumulated key gradients.
struct Layout {
    q: (usize, u64),
    k: (usize, u64),
    v: (usize, u64),
    dout: usize,
    q_row: u64,
    kv_row: u64,
    out: u64,
    out_row: u64,
    store: u64,
}

impl Layout {
    /// The separate op's operands `q, k, v, dout` and its output, the gradient of `which`.
    fn separate(g: &Geometry, which: AttnInput) -> Layout {
        let (q_row, kv_row) = (g.h * g.dh, g.kvh * g.dh);
        Layout {
            q: (0, 0),
            k: (1, 0),
            v: (2, 0),
            dout: 3,
            q_row,
            kv_row,
            out: 0,
            out_row: if which == AttnInput::Q { q_row } else { kv_row },
            store: 2,
        }
    }

    /// The packed op's operands, the blocks of `x` (input 0) and `dout` (input 1), and the
    /// block of `which` in its output `dx`; dv's accumulator is stored by phase 4.
    fn packed(g: &Geometry, which: AttnInput) -> Layout {
        let e = g.dtype.size();
        let row = (g.h + 2 * g.kvh) * g.dh;
        let (k_at, v_at) = (g.h * g.dh * e, (g.h + g.kvh) * g.dh * e);
        Layout {
            q: (0, 0),
            k: (0, k_at),
            v: (0, v_at),
            dout: 1,
            q_row: row,
            kv_row: row,
            out: match which {
                AttnInput::Q => 0,
                AttnInput::K => k_at,
                AttnInput::V => v_at,
            },
            out_row: row,
            store: if which == AttnInput::V { 4 } else { 2 },
        }
    }
}

/// The staged kernel of `g` for GEMM calls `calls` (its entry `entry`, taking `n_in` inputs),
/// with the soft cap's slopes kept when `slopes`.
fn staged_backward(
    a: &Args,
    p: &AttnParams,
    g: &Geometry,
    (entry, n_in): (&str, usize),
    slopes: bool,
    calls: Vec<Call>,
) -> Result<Kernel, CodegenError> {
    let [p_at, dp_at, ds_at, slope_at, acc_at, scratch_at] = g.regions;
    let mut lines = vec![
        c_u64("TQ", g.tq),
        c_u64("TK", g.tk),
        c_u64("TKLD", g.tk_ld),
        c_u64("H", g.h),
        c_u64("KVH", g.kvh),
        c_u64("DH", g.dh),
        c_bool("CAUSAL", p.causal),
        c_f32("SCALE", p.scale),
        c_u64("HC", g.hc),
        c_u64("RC", g.rc),
        c_u64("POFF", p_at),
        c_u64("DPOFF", dp_at),
        c_u64("DSOFF", ds_at),
        c_u64("SLOPEOFF", slope_at),
        c_bool("SLOPES", slopes),
        c_u64("ACCOFF", acc_at),
    ];
    lines.extend(super::cuda::row_strides(a)?);
    lines.extend(super::cuda::masks(p));
    let kernel = staged(
        "attention_backward",
        &[super::cuda::ATTENTION, TEMPLATE],
        lines,
        (entry, a.ty(0)?, n_in),
        BLOCK,
    );
    Ok(kernel.with_library(calls, scratch_at))
}

/// The kernel and calls of the gradient of `which`.
pub(crate) fn attention_backward(
    a: &Args,
    p: &AttnParams,
    which: AttnInput,
) -> Result<Kernel, CodegenError> {
    let refs: Vec<&TensorType> = a.inputs.iter().collect();
    if mma_operands(&refs, p) {
        return super::backward_mma::attention_backward_mma(a, p, which);
    }
    let g = Geometry::of(&refs, p, which).ok_or_else(|| a.err("attention backward shapes"))?;
    let calls = calls(&g, p, which, &Layout::separate(&g, which));
    let slopes = p.softcap.is_some() && which != AttnInput::V;
    let entry = ("attention_backward_kernel", p.inputs() + 1);
    staged_backward(a, p, &g, entry, slopes, calls)
}

/// The geometry of the packed backward: that of dk, whose workspace also holds what dq and
/// dv need.
fn packed_geometry(inputs: &[&TensorType], p: &AttnParams) -> Option<Geometry> {
    let [q, k, _] = super::rules::unpacked(inputs.first()?, p).ok()?;
    Geometry::of(&[&q, &k], p, AttnInput::K)
}

/// The kernel and calls of the packed backward: the GEMMs and stages of dq, dk and dv in
/// turn, sharing one workspace, each writing its block of `dx`.
pub(crate) fn packed_attention_backward(a: &Args, p: &AttnParams) -> Result<Kernel, CodegenError> {
    let refs: Vec<&TensorType> = a.inputs.iter().collect();
    if packed_mma_operands(&refs, p) {
        return super::backward_mma::packed_attention_backward_mma(a, p);
    }
    let g = packed_geometry(&refs, p).ok_or_else(|| a.err("attention backward shapes"))?;
    let calls = [AttnInput::Q, AttnInput::K, AttnInput::V]
        .into_iter()
        .flat_map(|which| calls(&g, p, which, &Layout::packed(&g, which)))
        .collect();
    let entry = ("packed_attention_backward_kernel", p.packed_inputs() + 1);
    staged_backward(a, p, &g, entry, p.softcap.is_some(), calls)
}

/// The GEMMs and launches of every unit in order.
fn calls(g: &Geometry, p: &AttnParams, which: AttnInput, at: &Layout) -> Vec<Call> {
    let [p_at, dp_at, ds_at, _, acc_at, _] = g.regions;
    let t = g.dtype;
    let group = g.h / g.kvh.max(1);
    let (q_row, kv_row, dout_row) = (at.q_row, at.kv_row, g.h * g.dh);
    let accumulates = g.accumulates && which != AttnInput::Q;
    // Per batch item (head), each operand advances by a head's columns; k and v only when
    // every query head has its own kv head (a group's heads run one at a time).
    let kv_step = if group == 1 { g.dh } else { 0 };
    let unit_scores = g.rc * g.tk_ld;
    let direct = which != AttnInput::Q && !accumulates;
    // A windowed unit adds to the accumulator's rows of the keys it sees only: zeroed first.
    let zeroed = accumulates && p.window.is_some();
    let mut out = Vec::new();
    for b in 0..g.b {
        // Units of kv output: a chunk of heads (no groups), or one kv head and its group.
        let kv_units: Vec<(u64, Vec<u64>)> = if group == 1 {
            (0..g.h)
                .step_by(g.hc as usize)
                .map(|h0| (h0, vec![h0]))
                .collect()
        } else {
            (0..g.kvh)
                .map(|k| (k, (k * group..(k + 1) * group).collect()))
                .collect()
        };
        for (g0, heads) in kv_units {
            let kv_unit = (if group == 1 { g.hc.min(g.h - g0) } else { 1 }) * g.tk * g.dh;
            let kv_launch =
                |phase| Call::launch(kv_unit.div_ceil(u64::from(BLOCK)), phase, b * g.kvh + g0);
            if zeroed {
                out.push(kv_launch(3));
            }
            let mut contributions = 0u64;
            for h0 in heads {
                let hn = if group == 1 { g.hc.min(g.h - h0) } else { 1 };
                let kv = h0 / group;
                for r0 in (0..g.tq).step_by(g.rc as usize) {
                    let rn = g.rc.min(g.tq - r0);
                    let (k0, kn) = g.keys(p, r0, rn);
                    let chunk = (b * g.h + h0) * g.tq + r0;
                    let q = Addr::Input(at.q.0, at.q.1 + g.at_q(b, r0, h0, q_row));
                    let dout = Addr::Input(at.dout, g.at_q(b, r0, h0, dout_row));
                    let kvm =
                        |(i, col): (usize, u64)| Addr::Input(i, col + g.at_kv(b, k0, kv, kv_row));
                    let strides = (g.dh, kv_step, unit_scores);
                    // s = SCALE q k^T
                    out.push(Call::gemm(
                        Gemm::row_major(
                            (q, t, false, q_row),
                            (kvm(at.k), t, true, kv_row),
                            (Addr::Workspace(0), DType::F32, g.tk_ld),
                            (rn, kn, g.dh),
                        )
                        .batched(hn, strides)
                        .scaled(p.scale, 0.0),
                    ));
                    out.push(Call::launch(rn * hn, 0, chunk));
                    let beta = if contributions > 0 || zeroed {
                        1.0
                    } else {
                        0.0
                    };
                    let kv_out = if direct {
                        (
                            Addr::Output(at.out + g.at_kv(b, k0, h0, at.out_row)),
                            t,
                            at.out_row,
                        )
                    } else {
                        (Addr::Workspace(acc_at + k0 * g.dh * 4), DType::F32, g.dh)
                    };
                    let kv_out_step = if direct { g.dh } else { g.tk * g.dh };
                    if which == AttnInput::V {
                        // dv += p^T dout
                        out.push(Call::gemm(
                            Gemm::row_major(
                                (Addr::Workspace(p_at), t, true, g.tk_ld),
                                (dout, t, false, dout_row),
                                kv_out,
                                (kn, g.dh, rn),
                            )
                            .batched(hn, (unit_scores, g.dh, kv_out_step))
                            .scaled(1.0, beta),
                        ));
                    } else {
                        // dp = dout v^T, then ds
                        out.push(Call::gemm(
                            Gemm::row_major(
                                (dout, t, false, dout_row),
                                (kvm(at.v), t, true, kv_row),
                                (Addr::Workspace(dp_at), DType::F32, g.tk_ld),
                                (rn, kn, g.dh),
                            )
                            .batched(hn, strides),
                        ));
                        out.push(Call::launch(rn * hn, 1, chunk));
                        let ds = (Addr::Workspace(ds_at), t, which == AttnInput::K, g.tk_ld);
                        out.push(Call::gemm(if which == AttnInput::Q {
                            // dq = ds k
                            Gemm::row_major(
                                ds,
                                (kvm(at.k), t, false, kv_row),
                                (
                                    Addr::Output(at.out + g.at_q(b, r0, h0, at.out_row)),
                                    t,
                                    at.out_row,
                                ),
                                (rn, g.dh, kn),
                            )
                            .batched(hn, (unit_scores, kv_step, g.dh))
                        } else {
                            // dk += ds^T q
                            Gemm::row_major(ds, (q, t, false, q_row), kv_out, (kn, g.dh, rn))
                                .batched(hn, (unit_scores, g.dh, kv_out_step))
                                .scaled(1.0, beta)
                        }));
                    }
                    contributions += 1;
                }
            }
            if accumulates {
                out.push(kv_launch(at.store));
            }
        }
    }
    out
}

/// Whether the backward runs on tensor cores (`backward_mma.rs`): the forward's condition
/// on the operands' type and head dim.
fn mma_operands(inputs: &[&TensorType], p: &AttnParams) -> bool {
    inputs.first().is_some_and(|q| {
        let dh = u(q.shape.get(2).copied().unwrap_or(0)) / u(p.heads).max(1);
        super::cuda::on_tensor_cores(q.dtype, dh)
    })
}

/// Whether the packed backward runs on tensor cores: [`mma_operands`] of x's q block.
fn packed_mma_operands(inputs: &[&TensorType], p: &AttnParams) -> bool {
    let q = inputs
        .first()
        .and_then(|x| super::rules::unpacked(x, p).ok());
    q.is_some_and(|[q, ..]| mma_operands(&[&q], p))
}

/// Workspace bytes of the packed backward on CUDA: on tensor cores the rows' statistics;
/// else dk's regions (which hold dq's and dv's) and cuBLASLt's scratch.
pub(crate) fn packed_workspace_bytes(inputs: &[&TensorType], p: &AttnParams) -> u64 {
    if packed_mma_operands(inputs, p) {
        return super::backward_mma::packed_workspace_bytes(inputs, p);
    }
    packed_geometry(inputs, p).map_or(0, |g| g.regions[5] + GEMM_WORKSPACE)
}

/// Workspace bytes of an attention backward op on CUDA: on tensor cores the rows'
/// statistics; else its regions and cuBLASLt's scratch.
pub(crate) fn workspace_bytes(inputs: &[&TensorType], p: &AttnParams, which: AttnInput) -> u64 {
    if mma_operands(inputs, p) {
        return super::backward_mma::workspace_bytes(inputs, p, which);
    }
    Geometry::of(inputs, p, which).map_or(0, |g| g.regions[5] + GEMM_WORKSPACE)
}
