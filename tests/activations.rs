//! Per-layer activation bytes of a GPT-style model against Korthikanti et al., "Reducing
//! Activation Recomputation in Large Transformer Models" (MLSys 2023), Section 4.1: a
//! transformer layer stores `sbh(34 + 5as/h)` bytes of 16-bit activations without
//! recomputation (`s` sequence, `b` batch, `h` hidden, `a` heads), of which `5as²b` are the
//! attention scores, softmax and its dropout mask, which flash attention never stores.
//! With tensor parallelism over `t` ranks (Section 4.2) each rank stores
//! `sbh(10 + 24/t + 5as/(ht))`: the 10sbh of the layernorms, their outputs and the dropout
//! masks stay whole on every rank, the rest is split.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use common::{compiled_with, example, overrides};
use memc::budget::CheckpointMode;
use memc::ir::Phase;
use memc::plan::{Plan, Role};
use memc::settings::Precision;
use memc::Options;

/// GPT-2 small's shape at one sequence of 1,024 tokens.
const S: u64 = 1024;
const B: u64 = 1;
const H: u64 = 768;
const A: u64 = 12;
const LAYERS: usize = 12;

/// Korthikanti et al.'s per-layer bytes, with the attention term or without it (flash).
fn korthikanti(flash: bool) -> u64 {
    let scores = if flash { 0 } else { 5 * A * S * S * B };
    34 * S * B * H + scores
}

/// The bytes of every forward value of `scope` that backward reads (saved activations,
/// views counted once, at their root), each with its op, in step order.
fn saved_in(plan: &Plan, scope: &str) -> Vec<(&'static str, u64)> {
    plan.steps
        .iter()
        .filter(|s| s.phase == Phase::Forward && s.scope == scope)
        .filter_map(|s| {
            let b = &plan.buffers[s.output?.index()];
            let saved = b.role == Some(Role::SavedActivation) && b.view_of.is_none();
            saved.then_some((s.op.name(), b.bytes))
        })
        .collect()
}

/// Korthikanti et al.'s per-layer bytes on each of `t` tensor-parallel ranks, with the
/// attention term or without it (flash).
fn korthikanti_tensor(t: u64, flash: bool) -> u64 {
    let scores = if flash { 0 } else { 5 * A * S * S * B / t };
    10 * S * B * H + 24 * S * B * H / t + scores
}

fn gpt2_bf16(checkpoint: CheckpointMode) -> memc::Compiled {
    gpt2_bf16_over(checkpoint, 1)
}

/// GPT-2 small in bf16 on each of `tensor` tensor-parallel ranks.
fn gpt2_bf16_over(checkpoint: CheckpointMode, tensor: u32) -> memc::Compiled {
    let dims = [("B", B as i64), ("T", S as i64)];
    let o = Options {
        overrides: overrides(&dims),
        precision: Some(Precision::Bf16),
        checkpoint,
        parallel: (tensor > 1).then_some(memc::parallel::Parallel {
            tensor,
            ..memc::parallel::Parallel::default()
        }),
        ..Options::default()
    };
    compiled_with(&example("gpt2"), &o)
}

/// GPT-2 small in bf16, everything saved (`--checkpoint none`): every layer keeps 36sbh =
/// 28,311,552 bytes, where the formula gives 89,653,248 (34sbh + 5as²b) and, with flash
/// attention, 34sbh = 26,738,688. memc's attention recomputes its scores in backward, so the
/// 5as²b term is absent; GPT-2 as written has no dropout, so the two 1-byte masks (2sbh) are
/// absent too; and memc's residual stream is fp32, so the two layernorms' inputs take 4sbh
/// each where the paper's 16-bit activations take 2sbh: 34 - 2 + 4 = 36.
#[test]
fn gpt2_layers_against_korthikanti() {
    let (sbh, c) = (S * B * H, gpt2_bf16(CheckpointMode::KeepAll));
    let plan = c.plan.plan();
    assert_eq!(korthikanti(false), 89_653_248);
    assert_eq!(korthikanti(true), 26_738_688);
    for layer in 0..LAYERS {
        let saved = saved_in(plan, &format!("layer.{layer}"));
        let units: Vec<(&str, u64)> = saved.iter().map(|&(op, b)| (op, b / sbh)).collect();
        assert!(saved.iter().all(|&(_, b)| b % sbh == 0), "{saved:?}");
        assert_eq!(
            units,
            [
                ("norm", 2),             // layernorm 1's output, stored bf16: the QKV matmul's input
                ("matmul", 6),           // Q, K and V, packed as the QKV product
                ("packed_attention", 2), // its output: the projection's input, flash's backward
                ("binary", 4),           // the fp32 residual after attention: layernorm 2's input
                ("norm", 2),             // layernorm 2's output, stored bf16: the MLP's input
                ("matmul", 8),           // the first linear's output, bias added: GELU's input
                ("unary", 8),            // GELU's output: the second linear's input
                ("binary", 4),           // the fp32 layer output: the next layernorm's input
            ],
            "layer {layer}"
        );
        let bytes: u64 = saved.iter().map(|&(_, b)| b).sum();
        assert_eq!(bytes, 28_311_552);
        assert_eq!(bytes, korthikanti(true) - 2 * sbh + 2 * 2 * sbh);
    }
}

/// Without a budget memc recomputes pointwise ops and norms from values saved anyway (the
/// layernorms, their casts, GELU): 22sbh = 17,301,504 bytes a layer, below the formula's
/// 34sbh with flash attention.
#[test]
fn gpt2_layers_by_default() {
    let (sbh, c) = (S * B * H, gpt2_bf16(CheckpointMode::Auto));
    let plan = c.plan.plan();
    for layer in 0..LAYERS {
        let saved = saved_in(plan, &format!("layer.{layer}"));
        let bytes: u64 = saved.iter().map(|&(_, b)| b).sum();
        assert_eq!(
            (bytes, bytes / sbh),
            (17_301_504, 22),
            "layer {layer}: {saved:?}"
        );
    }
}

/// GPT-2 small in bf16 over t = 2 and 4 tensor ranks, everything saved: each rank keeps
/// the replicated layernorm inputs (fp32, 4sbh each), the QKV and MLP inputs (2sbh each),
/// and 1/t of Q, K, V, the attention output (2sbh each), the first linear's output and
/// GELU's (8sbh each): 12sbh + 24sbh/t, the formula's flash form less the absent dropout
/// masks (2sbh) plus the fp32 residual (2 x 2sbh) as at t = 1: 24sbh = 18,874,368 bytes at
/// t = 2, 18sbh = 14,155,776 at t = 4.
#[test]
fn gpt2_tensor_parallel_layers_against_korthikanti() {
    let sbh = S * B * H;
    assert_eq!(korthikanti_tensor(1, true), korthikanti(true));
    assert_eq!(korthikanti_tensor(1, false), korthikanti(false));
    assert_eq!(korthikanti_tensor(2, true), 17_301_504);
    assert_eq!(korthikanti_tensor(2, false), 48_758_784);
    for (t, expected) in [(2u64, 18_874_368), (4, 14_155_776)] {
        let c = gpt2_bf16_over(CheckpointMode::KeepAll, t as u32);
        let plan = c.plan.plan();
        for layer in 0..LAYERS {
            let saved = saved_in(plan, &format!("layer.{layer}"));
            let units: Vec<(&str, u64)> = saved.iter().map(|&(op, b)| (op, b * t / sbh)).collect();
            assert_eq!(
                units,
                [
                    ("cast", 2 * t),         // layernorm 1's output in bf16, whole
                    ("matmul", 6),           // this rank's Q, K and V heads, packed
                    ("packed_attention", 2), // their output
                    ("binary", 4 * t),       // the fp32 residual, whole
                    ("cast", 2 * t),         // layernorm 2's output in bf16, whole
                    ("matmul", 8),           // this rank's columns of the first linear's output
                    ("unary", 8),            // GELU's output
                    ("binary", 4 * t),       // the fp32 layer output, whole
                ],
                "t = {t}, layer {layer}"
            );
            let bytes: u64 = saved.iter().map(|&(_, b)| b).sum();
            assert_eq!(bytes, expected, "t = {t}");
            assert_eq!(bytes, korthikanti_tensor(t, true) - 2 * sbh + 2 * 2 * sbh);
        }
    }
}
