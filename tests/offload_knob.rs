//! Offload as one more knob of the planner: under a budget on the CPU target, `memc
//! compile` (`compile_or_offload`) weighs the saved activations, the optimizer state and
//! both in host memory against checkpointing and takes the least estimated step time that
//! fits; `memc fit` falls back to the offload reaching the largest value when nothing fits
//! without one. Exact bytes both ways.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{compiled_with, example};
use memc::cost::Gpu;
use memc::settings::{Offload, Precision};
use memc::Options;

/// GPT-2 small's bf16 step on the CPU target within `budget` bytes, estimated on the H100.
fn gpt2(budget: u64) -> Options {
    Options {
        precision: Some(Precision::Bf16),
        budget: Some(budget),
        gpu: Some(Gpu::H100),
        ..Options::default()
    }
}

fn seconds(c: &memc::Compiled) -> f64 {
    c.plan.plan().report.estimate.as_ref().unwrap().seconds
}

#[test]
fn checkpointing_wins_where_it_reaches_the_budget() {
    let src = example("gpt2");
    let options = gpt2(3 << 30);
    let (c, offload) = memc::compile_or_offload(&src, &options).unwrap();
    assert_eq!(offload, None);
    let plan = c.plan.plan();
    assert_eq!((plan.arena_bytes, plan.host_bytes), (3_122_262_020, 0));
    assert!(plan.report.recompute_percent() > 0.0);
    // Every offload also fits this budget, and each is estimated slower.
    for knob in memc::OFFLOAD_KNOBS {
        let o = compiled_with(
            &src,
            &Options {
                offload: Some(knob),
                ..options.clone()
            },
        );
        assert!(o.plan.plan().host_bytes > 0, "{knob:?}");
        assert!(seconds(&o) > seconds(&c), "{knob:?}");
    }
}

#[test]
fn activation_offload_wins_where_recomputation_cannot_reach_the_budget() {
    let src = example("gpt2");
    let options = gpt2(2 << 30);
    // No recomputation reaches 2 GiB with everything on the device.
    assert!(memc::compile(&src, &options).is_err());
    let (c, offload) = memc::compile_or_offload(&src, &options).unwrap();
    assert_eq!(offload, Some(Offload::Activations));
    let plan = c.plan.plan();
    assert_eq!(
        (plan.arena_bytes, plan.host_bytes),
        (1_879_251_460, 1_686_142_976)
    );
    // The optimizer state on the host fits too (with the first 3 blocks recomputed), but
    // its host update makes it slower by the estimate.
    let optimizer = compiled_with(
        &src,
        &Options {
            offload: Some(Offload::Optimizer),
            ..options.clone()
        },
    );
    assert_eq!(optimizer.plan.plan().arena_bytes, 2_126_743_556);
    assert!(seconds(&optimizer) > seconds(&c));
    // A setting given is kept, and no budget leaves everything on the device.
    let given = Options {
        offload: Some(Offload::Optimizer),
        ..options.clone()
    };
    let (_, kept) = memc::compile_or_offload(&src, &given).unwrap();
    assert_eq!(kept, None);
    // `--offload none` keeps everything on the device: no plan then.
    let nothing = Options {
        offload: Some(Offload::Nothing),
        ..options.clone()
    };
    assert!(memc::compile_or_offload(&src, &nothing).is_err());
    let text = "model m {\n  dim N = 4\n  input x: [N, N]\n  param w: [N, N]\n  loss = mean(x @ w)\n  train {\n    offload = none\n  }\n}\n";
    let c = compiled_with(text, &Options::default());
    let train = c.plan.plan().train.clone().unwrap();
    assert_eq!(
        (train.offload, c.plan.plan().host_bytes),
        (Some(Offload::Nothing), 0)
    );
    let unbudgeted = Options {
        budget: None,
        ..options
    };
    let (c, none) = memc::compile_or_offload(&src, &unbudgeted).unwrap();
    assert_eq!((none, c.plan.plan().host_bytes), (None, 0));
}

#[test]
fn fit_takes_the_offload_reaching_the_largest_batch_when_nothing_fits_without_one() {
    let src = example("gpt2");
    let options = Options {
        budget: None,
        ..gpt2(0)
    };
    let found = memc::fit::fit_dim(&src, &options, "B", 1_500 << 20).unwrap();
    let plan = found.plan.plan();
    let offload = plan.train.as_ref().and_then(|t| t.offload);
    assert_eq!(offload, Some(Offload::All));
    assert_eq!((found.value, found.arena_bytes), (45, 1_566_042_628));
    assert_eq!(
        (found.next_value, found.next_arena_bytes),
        (46, 1_588_066_820)
    );
    // The file's B = 8 fits with everything on the device at 3 GiB: no offload there.
    let plain = memc::fit::fit_dim(&src, &options, "B", 3 << 30).unwrap();
    assert_eq!(plain.plan.plan().train.as_ref().unwrap().offload, None);
    assert_eq!(plain.plan.plan().host_bytes, 0);
}
