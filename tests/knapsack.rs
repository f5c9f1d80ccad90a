//! The knapsack checkpointing policy: per block instance, pointwise, selective or whole
//! recomputation, chosen for the fewest recomputed FLOPs per byte saved. As the saving asked
//! for grows, the bytes kept for backward never rise and the recomputation never falls; the
//! largest saving recomputes every instance; the policy is selectable with
//! `--checkpoint knapsack=SIZE` and a bad size is a diagnostic.
#![allow(clippy::unwrap_used)]

mod common;

use common::{compiled_with, example};
use memc::budget::CheckpointMode;
use memc::passes::checkpoint;
use memc::Options;

fn small_gpt(checkpoint: CheckpointMode) -> Options {
    Options {
        overrides: common::tiny_gpt(2),
        checkpoint,
        ..Options::default()
    }
}

/// (bytes kept for backward, recompute FLOPs) of the plan under `mode`.
fn kept_and_recomputed(src: &str, mode: CheckpointMode) -> (u64, u64) {
    let compiled = compiled_with(src, &small_gpt(mode));
    let summary = compiled.plan.plan().report.checkpoint.clone().unwrap();
    (summary.kept_bytes, summary.recompute_flops)
}

#[test]
fn larger_savings_keep_less_and_recompute_more() {
    let src = example("gpt2");
    let graph = compiled_with(&src, &small_gpt(CheckpointMode::KeepAll)).graph;
    let savings = checkpoint::knapsack_savings(&graph, 64);
    assert!(savings.len() >= 4, "{savings:?}");
    assert!(savings.windows(2).all(|w| w[0] < w[1]), "{savings:?}");
    let pointwise = kept_and_recomputed(&src, CheckpointMode::Pointwise);
    let plans: Vec<(u64, u64)> = savings
        .iter()
        .map(|&s| kept_and_recomputed(&src, CheckpointMode::Knapsack(s)))
        .collect();
    let mut previous = pointwise;
    for (&saving, &(kept, flops)) in savings.iter().zip(&plans) {
        assert!(
            kept < previous.0,
            "saving {saving}: kept {kept} after {previous:?}"
        );
        assert!(
            flops >= previous.1,
            "saving {saving}: {flops} after {previous:?}"
        );
        assert!(
            pointwise.0 - kept >= saving,
            "saving {saving}: only {} saved",
            pointwise.0 - kept
        );
        previous = (kept, flops);
    }
    // Past every step, every instance is recomputed whole: as per-block checkpointing keeps
    // only what crosses blocks, and never less than it.
    let all = kept_and_recomputed(&src, CheckpointMode::Knapsack(u64::MAX));
    let block = kept_and_recomputed(&src, CheckpointMode::BLOCK);
    assert_eq!(all, *plans.last().unwrap());
    assert!(all.0 <= block.0, "{all:?} against block {block:?}");
}

#[test]
fn the_summary_names_the_saving_that_selects_the_plan() {
    let src = example("gpt2");
    let graph = compiled_with(&src, &small_gpt(CheckpointMode::KeepAll)).graph;
    let saving = checkpoint::knapsack_savings(&graph, 4)[1];
    let compiled = compiled_with(&src, &small_gpt(CheckpointMode::Knapsack(saving)));
    let summary = compiled.plan.plan().report.checkpoint.clone().unwrap();
    assert!(
        summary.policy.starts_with(&format!("knapsack={saving}: ")),
        "{}",
        summary.policy
    );
}

#[test]
fn a_bad_size_is_a_diagnostic() {
    for (text, why) in [
        ("knapsack=", "is not a size"),
        ("knapsack=1.5Gb", "unknown size unit `Gb`"),
        ("knapsack=-3", "must be positive"),
        ("knapsack=0", "must be positive"),
    ] {
        let err = CheckpointMode::parse(text).unwrap_err();
        assert!(err.message.contains(why), "{text}: {}", err.message);
        let span = err.span.unwrap();
        assert_eq!(
            (span.start, span.end),
            ("knapsack=".len(), text.len()),
            "{text}"
        );
    }
    assert_eq!(
        CheckpointMode::parse("knapsack=4096").unwrap(),
        CheckpointMode::Knapsack(4096)
    );
    assert_eq!(
        CheckpointMode::parse("knapsack=1.5GiB").unwrap(),
        CheckpointMode::Knapsack(3 << 29)
    );
}
