//! Checkpointing: recomputation changes memory, never results — gradients and updated
//! parameters are bitwise identical to the keep-everything plan on the CPU backend, dropout
//! included; budgets are met, and an impossible budget gets its diagnostic.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use common::{compiled_with, example, executor};
use memc::budget::CheckpointMode;
use memc::front::train::Precision;
use memc::{CompileError, Options};
use std::collections::BTreeMap;

fn small_gpt(checkpoint: CheckpointMode, budget: Option<u64>) -> Options {
    Options {
        overrides: common::tiny_gpt(2),
        checkpoint,
        budget,
        ..Options::default()
    }
}

/// Bit patterns of tensors by name.
type Bits = BTreeMap<String, Vec<u32>>;

/// Gradient bits of the first step, parameter bits after two steps, and the arena size.
fn fingerprint(src: &str, options: &Options) -> (Bits, Bits, u64) {
    let c = compiled_with(src, options);
    let mut ex = executor(&c, 11);
    let mut grads = BTreeMap::new();
    ex.run_step(Some(&mut |n: &str, g: &[f32]| {
        grads.insert(n.to_string(), g.iter().map(|x| x.to_bits()).collect());
    }))
    .expect("step");
    ex.run_step(None).expect("step");
    let params = ex
        .plan()
        .params
        .iter()
        .map(|p| {
            (
                p.name.clone(),
                ex.read(p.buffer).iter().map(|x| x.to_bits()).collect(),
            )
        })
        .collect();
    (grads, params, c.plan.plan().arena_bytes)
}

const DROPOUT_GPT: &str = "model g {
  dim B = 2, T = 8, D = 16, H = 2, V = 32, L = 3
  input tokens: i32[B, T]
  input targets: i32[B, T]
  param wte: [V, D] = normal(0.02)
  block layer(x) {
    param ln: layernorm(D)
    param qkv: linear(D, 3*D)
    param fc: linear(D, 4*D)
    param proj: linear(4*D, D)
    let q, k, v = split(linear(layernorm(x, ln), qkv), 3)
    x = x + dropout(attention(q, k, v, heads = H, causal = true), p = 0.2)
    x = x + dropout(linear(gelu(linear(x, fc)), proj), p = 0.2)
    return x
  }
  let x = repeat L layer(embed(wte, tokens))
  loss = cross_entropy(x @ transpose(wte), targets)
  train { optimizer = adamw(lr = 1e-2) }
}";

/// Checkpointing options in `precision` (the file's when None).
fn checkpointed(mode: CheckpointMode, precision: Option<Precision>) -> Options {
    Options {
        precision,
        ..small_gpt(mode, None)
    }
}

#[test]
fn recomputation_is_bitwise_identical() {
    let cases = [
        (example("gpt2"), None),
        (DROPOUT_GPT.to_string(), None),
        (DROPOUT_GPT.to_string(), Some(Precision::Bf16)),
    ];
    for (src, precision) in cases {
        let base = fingerprint(&src, &checkpointed(CheckpointMode::KeepAll, precision));
        for mode in [CheckpointMode::MinCut, CheckpointMode::Segments(2)] {
            let other = fingerprint(&src, &checkpointed(mode, precision));
            assert_eq!(base.0, other.0, "{mode:?}: gradients differ");
            assert_eq!(base.1, other.1, "{mode:?}: parameters differ");
            assert!(
                other.2 < base.2,
                "{mode:?}: arena {} not below keep-all {}",
                other.2,
                base.2
            );
        }
    }
}

#[test]
fn auto_meets_a_tight_budget_with_identical_results() {
    let src = DROPOUT_GPT.to_string();
    let base = fingerprint(&src, &small_gpt(CheckpointMode::KeepAll, None));
    let mincut = compiled_with(&src, &small_gpt(CheckpointMode::MinCut, None))
        .plan
        .plan()
        .arena_bytes;
    let budget = mincut - 1;
    let fit = compiled_with(&src, &small_gpt(CheckpointMode::Auto, Some(budget)));
    let plan = fit.plan.plan();
    assert!(
        plan.arena_bytes <= budget,
        "arena {} over budget {budget}",
        plan.arena_bytes
    );
    let summary = plan.report.checkpoint.as_ref().expect("checkpoint summary");
    assert!(summary.recompute_flops > 0);
    assert!(
        summary
            .recomputed
            .iter()
            .any(|g| g.op == "matmul" || g.op == "attention"),
        "heavy ops recomputed under a tight budget"
    );
    let again = fingerprint(&src, &small_gpt(CheckpointMode::Auto, Some(budget)));
    assert_eq!(base.0, again.0);
    assert_eq!(base.1, again.1);
}

#[test]
fn impossible_budget_names_the_minimum() {
    let result = memc::compile(
        &example("gpt2"),
        &small_gpt(CheckpointMode::Auto, Some(1 << 16)),
    );
    let Err(CompileError::User(e)) = result else {
        panic!("expected a user error")
    };
    assert!(
        e.message.contains("no plan fits the budget of 64.0 KiB"),
        "{}",
        e.message
    );
    assert!(e.help.contains("minimum feasible budget"), "{}", e.help);
    assert!(e.span.is_some());
}

#[test]
fn weight_copies_are_made_once_per_step_under_recomputation() {
    let copies = |mode| {
        let c = compiled_with(DROPOUT_GPT, &checkpointed(mode, Some(Precision::Bf16)));
        let p = c
            .plan
            .plan()
            .report
            .precision
            .clone()
            .expect("bf16 summary");
        (p.weight_copies, p.weight_copy_bytes)
    };
    let keep = copies(CheckpointMode::KeepAll);
    assert!(keep.0 > 0);
    for mode in [CheckpointMode::MinCut, CheckpointMode::Segments(2)] {
        assert_eq!(copies(mode), keep, "{mode:?} recomputed a weight copy");
    }
}
