//! Saved activations in host memory (`--offload activations`): each activation backward
//! reads is copied to the host after its producer and back just before its first backward
//! reader. The device arena shrinks by exact bytes, the copies are reported, and the plan
//! trains bit for bit as the plain one does on the CPU.
#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout
)]

mod common;

use common::{compiled_with, example, executor, loss, overrides, SMALL_GPT};
use memc::budget::CheckpointMode;
use memc::ir::Op;
use memc::plan::{BufferClass, Tier};
use memc::settings::{Offload, Precision};
use memc::Options;

/// A LLaMA small enough to train in tests: 2 layers, D=32, T=16, V=64, 2 heads, F=48, B=2.
const SMALL_LLAMA: &[(&str, i64)] = &[
    ("B", 2),
    ("T", 16),
    ("D", 32),
    ("H", 2),
    ("V", 64),
    ("L", 2),
    ("F", 48),
];

fn with(options: &Options, offload: Offload) -> Options {
    Options {
        offload: Some(offload),
        ..options.clone()
    }
}

/// Losses of `steps` steps from seed 5 and every parameter's bits after them.
fn trained(src: &str, options: &Options, steps: usize) -> (Vec<u32>, Vec<Vec<u32>>) {
    let c = compiled_with(src, options);
    let mut ex = executor(&c, 5);
    let losses = (0..steps).map(|_| loss(&mut ex).to_bits()).collect();
    let plan = c.plan.plan();
    let params = plan
        .params
        .iter()
        .map(|p| ex.read(p.buffer).iter().map(|v| v.to_bits()).collect())
        .collect();
    (losses, params)
}

#[test]
fn plans_with_activations_on_the_host_train_bitwise_like_plain_ones() {
    let settings = [
        ("fp32", Options::default()),
        (
            "bf16",
            Options {
                precision: Some(Precision::Bf16),
                ..Options::default()
            },
        ),
        (
            "per-block checkpointing",
            Options {
                checkpoint: CheckpointMode::BLOCK,
                ..Options::default()
            },
        ),
        (
            "accumulation",
            Options {
                accumulate: Some(2),
                ..Options::default()
            },
        ),
    ];
    for (model, dims) in [("gpt2", SMALL_GPT), ("llama7b", SMALL_LLAMA)] {
        let src = example(model);
        for (label, options) in &settings {
            let options = Options {
                overrides: overrides(dims),
                ..options.clone()
            };
            let plain = trained(&src, &options, 3);
            for offload in [Offload::Activations, Offload::All] {
                let moved = with(&options, offload);
                let c = compiled_with(&src, &moved);
                let plan = c.plan.plan();
                assert!(plan.host_bytes > 0, "{model} {label}: no host arena");
                assert!(
                    plan.steps.iter().any(|s| s.op == Op::CopyFromHost),
                    "{model} {label}: nothing is fetched back"
                );
                let off = trained(&src, &moved, 3);
                assert_eq!(plain.0, off.0, "{model} {label} {offload:?}: losses");
                assert!(plain.1 == off.1, "{model} {label} {offload:?}: parameters");
            }
        }
    }
}

/// GPT-2 small in bf16 at its file dims (B=8, T=1024): every byte backward reads from the
/// forward crosses the link once each way, and the device arena no longer holds the saved
/// activations across the step.
#[test]
fn gpt2_bf16_activations_move_to_the_host_in_exact_bytes() {
    let src = example("gpt2");
    let bf16 = Options {
        precision: Some(Precision::Bf16),
        ..Options::default()
    };
    let plain = compiled_with(&src, &bf16);
    let off = compiled_with(&src, &with(&bf16, Offload::Activations));
    let (p, o) = (plain.plan.plan(), off.plan.plan());
    let saved = p.report.bytes.activations;
    let transfers = o.report.transfers.clone().expect("transfers");
    assert_eq!((transfers.to_host, transfers.to_device), (saved, saved));
    let host = o.report.host.expect("a host arena");
    assert_eq!(o.host_bytes, host.arena);
    assert_eq!(host.optimizer, 0);
    assert!(o
        .buffers
        .iter()
        .filter(|b| b.tier == Tier::Host)
        .all(|b| b.class == BufferClass::Activation));
    println!(
        "gpt2 bf16: device arena {} plain, {} with activations on the host; host arena {}; \
         saved {saved}",
        p.arena_bytes, o.arena_bytes, host.arena
    );
    // 124 copies: 62 saved activations, each out and back; the host arena is their sum
    // (all live at the end of the forward), the device arena falls by 44%.
    assert_eq!(saved, 1_686_142_976);
    assert_eq!(transfers.copies, 124);
    assert_eq!(host.arena, saved);
    assert_eq!(
        (p.arena_bytes, o.arena_bytes),
        (3_462_000_644, 1_956_446_212)
    );
}

/// The estimate prices the copies by the host link and hides them behind the forward and
/// backward compute they run beside.
#[test]
fn the_cost_model_overlaps_activation_copies_with_compute() {
    let src = example("gpt2");
    let options = Options {
        precision: Some(Precision::Bf16),
        offload: Some(Offload::Activations),
        gpu: Some(memc::cost::Gpu::H100),
        ..Options::default()
    };
    let c = compiled_with(&src, &options);
    let estimate = c.plan.plan().report.estimate.clone().expect("an estimate");
    let offload = estimate.offload.expect("an offload estimate");
    assert!(offload.transfer_seconds > 0.0);
    assert!(offload.overlapped_seconds > 0.0);
    assert_eq!(offload.host_update_seconds, 0.0);
    let want = (offload.transfer_seconds - offload.overlapped_seconds).max(0.0);
    assert!((offload.extra_seconds - want).abs() < 1e-12);
}
