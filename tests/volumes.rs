//! Volumes: the 3-D UNet example trains on the CPU, the volume ops' gradients in bf16 and
//! fp16 track fp32, and the exact bytes of the README's "3-D segmentation at 256^3" case
//! study.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use common::{assert_success, compiled_with, example, executor, memc};
use memc::budget::CheckpointMode;
use memc::front::train::Precision;
use memc::Options;
use std::collections::BTreeMap;

/// The losses `memc run` prints, one per step.
fn printed_losses(stdout: &str) -> Vec<f64> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("step "))
        .filter_map(|l| l.split_once(" loss "))
        .filter_map(|(_, v)| v.trim().parse().ok())
        .collect()
}

/// `memc run examples/unet3d.mdl --set S=16` trains on the CPU backend: over four steps on
/// its synthetic batch the loss falls at every step, by more than a tenth in all.
#[test]
fn unet3d_trains_on_the_cpu_at_side_16() {
    let out = memc(&[
        "run",
        "examples/unet3d.mdl",
        "--set",
        "S=16",
        "--steps",
        "4",
    ]);
    assert_success(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let losses = printed_losses(&stdout);
    assert_eq!(losses.len(), 4, "{stdout}");
    for pair in losses.windows(2) {
        assert!(pair[1] < pair[0], "the loss rose: {losses:?}");
    }
    assert!(losses[3] < 0.9 * losses[0], "{losses:?}");
    // Four classes, uniform at first: the first loss is near ln 4.
    assert!((losses[0] - 4f64.ln()).abs() < 0.2, "{losses:?}");
}

/// Each parameter's first-step gradient of [`common::VOLUME_OPS`] in `precision`, from seed 3, fp16's
/// divided by its initial loss scale (2^16).
fn volume_gradients(precision: Precision) -> BTreeMap<String, Vec<f32>> {
    let options = Options {
        precision: Some(precision),
        ..Options::default()
    };
    let c = compiled_with(common::VOLUME_OPS, &options);
    let mut ex = executor(&c, 3);
    let mut grads = BTreeMap::new();
    let unscale = if precision == Precision::Fp16 {
        65536.0
    } else {
        1.0
    };
    let step = ex.run_step(Some(&mut |name: &str, g: &[f32]| {
        grads.insert(name.to_string(), g.iter().map(|v| v / unscale).collect());
    }));
    if let Err(e) = step {
        panic!("{precision:?} step: {e}");
    }
    grads
}

/// The volume ops in bf16 and fp16 (convolutions in the low precision with fp32
/// accumulation, norms and pooling in their input's precision, fp32 master weights) give
/// gradients close to fp32's: relative L2 error per parameter 0.45% median and 4.6% at
/// most in bf16 (the first convolution's weight, before a batch norm), 0.21% and 1.2% in
/// fp16; asserted at 1% and 8%, 0.5% and 3%.
#[test]
fn volume_op_gradients_in_bf16_and_fp16_track_fp32() {
    let reference = volume_gradients(Precision::Fp32);
    for (precision, median_bound, worst_bound) in [
        (Precision::Bf16, 0.01, 0.08),
        (Precision::Fp16, 0.005, 0.03),
    ] {
        let got = volume_gradients(precision);
        assert_eq!(reference.len(), got.len());
        let errors = common::relative_errors(&reference, &got);
        let median = errors[errors.len() / 2].0;
        let worst = errors[errors.len() - 1];
        assert!(
            median <= median_bound,
            "{precision:?} median {median}: {errors:?}"
        );
        assert!(worst.0 <= worst_bound, "{precision:?} worst {worst:?}");
    }
}

/// One row of the case study: its flags and the plan's exact bytes.
struct Row {
    checkpoint: &'static str,
    precision: Precision,
    accumulate: u32,
    side: i64,
    arena: u64,
    activations: u64,
}

/// The README's table "3-D segmentation at 256^3", byte for byte: the arena and the saved
/// activations of each plan for `examples/unet3d.mdl` (batch 1, AdamW).
#[test]
fn unet3d_case_study_bytes_are_exact() {
    use Precision::{Bf16, Fp16, Fp32};
    let rows = [
        ("none", Fp32, 1, 256, 36_624_785_156, 32_531_021_824),
        ("auto", Fp32, 1, 256, 28_135_514_372, 23_974_641_664),
        ("block", Fp32, 1, 256, 21_089_083_396, 12_700_352_512),
        ("none", Bf16, 1, 256, 18_346_008_324, 16_332_619_776),
        ("block", Bf16, 1, 256, 10_611_878_148, 6_383_730_688),
        ("block", Fp16, 1, 256, 10_611_879_428, 6_383_730_688),
        ("block", Bf16, 2, 256, 10_634_285_316, 6_383_730_688),
        ("none", Bf16, 1, 64, 352_837_380, 255_197_184),
        ("none", Bf16, 4, 64, 375_244_548, 255_197_184),
    ]
    .map(
        |(checkpoint, precision, accumulate, side, arena, activations)| Row {
            checkpoint,
            precision,
            accumulate,
            side,
            arena,
            activations,
        },
    );
    for row in rows {
        let label = format!(
            "--checkpoint {} --precision {:?} --accumulate {} --set S={}",
            row.checkpoint, row.precision, row.accumulate, row.side
        );
        let Ok(checkpoint) = CheckpointMode::parse(row.checkpoint) else {
            panic!("{label}: not a checkpoint mode");
        };
        let options = Options {
            checkpoint,
            precision: Some(row.precision),
            accumulate: Some(row.accumulate),
            overrides: common::overrides(&[("S", row.side)]),
            ..Options::default()
        };
        let c = compiled_with(&example("unet3d"), &options);
        let bytes = &c.plan.plan().report.bytes;
        assert_eq!(
            (bytes.arena, bytes.activations),
            (row.arena, row.activations),
            "{label}"
        );
    }
}
