//! Batch norm's running statistics, as `torch.nn.BatchNorm`: a training step moves them
//! towards each batch's per-channel mean and unbiased variance by `momentum`, once per
//! forward (recomputation does not move them again); a model without `train { }` (eval mode)
//! normalizes with them; they are state, not parameters.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use common::{compiled_with, executor};
use memc::budget::CheckpointMode;
use memc::exec::cpu::CpuExecutor;
use memc::settings::Precision;
use memc::Options;

const CHANNELS: usize = 3;

/// A conv net with two batch norms (the second with momentum 0.25) that trains with `train`.
fn model(train: &str) -> String {
    format!(
        "model bn {{
  dim B = 4, C = 3, S = 6
  input x: [B, C, S, S]
  param conv: conv2d(C, C, 3)
  param bn1: batchnorm(C)
  param bn2: batchnorm(C)
  let h = relu(batchnorm(conv2d(x, conv, padding = 1), bn1))
  let y = batchnorm(h, bn2, momentum = 0.25)
  {train}
}}"
    )
}

fn training() -> String {
    model(
        "loss = mean(y * y)
  train {
    optimizer = sgd(lr = 0.1)
  }",
    )
}

fn read(ex: &CpuExecutor, name: &str) -> Vec<f32> {
    let plan = ex.plan();
    let p = plan.params.iter().find(|p| p.name == name).unwrap();
    ex.read(p.buffer).to_vec()
}

fn input(ex: &CpuExecutor) -> Vec<f32> {
    let b = ex
        .plan()
        .inputs
        .iter()
        .find(|b| b.name == "x")
        .unwrap()
        .buffer;
    ex.bound(b).unwrap().to_vec()
}

/// Per-channel mean and unbiased variance of an `[N, C, ...]` tensor of `plane` elements per
/// sample and channel, in f64.
fn moments(x: &[f32], plane: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut means, mut vars) = (Vec::new(), Vec::new());
    for ch in 0..CHANNELS {
        let v: Vec<f64> = x
            .chunks(plane)
            .enumerate()
            .filter(|(k, _)| k % CHANNELS == ch)
            .flat_map(|(_, v)| v.iter().map(|&e| f64::from(e)))
            .collect();
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        means.push(mean);
        vars.push(v.iter().map(|e| (e - mean).powi(2)).sum::<f64>() / (n - 1.0));
    }
    (means, vars)
}

#[test]
fn a_training_step_moves_every_norms_statistics_and_counts_them_apart() {
    let c = compiled_with(&training(), &Options::default());
    // The conv's 3x3x3x3 weight (no bias) and two norms' weight and bias: the running
    // statistics are not counted.
    assert_eq!(c.plan.plan().report.param_count, 81 + 2 * 6);
    let mut ex = executor(&c, 3);
    for bn in ["bn1", "bn2"] {
        assert_eq!(
            read(&ex, &format!("{bn}.running_mean")),
            vec![0.0; CHANNELS]
        );
        assert_eq!(read(&ex, &format!("{bn}.running_var")), vec![1.0; CHANNELS]);
    }
    ex.run_step(None).unwrap();
    for bn in ["bn1", "bn2"] {
        let mean = read(&ex, &format!("{bn}.running_mean"));
        let var = read(&ex, &format!("{bn}.running_var"));
        assert!(mean.iter().all(|&m| m != 0.0), "{bn}: {mean:?}");
        assert!(var.iter().all(|&v| v > 0.0 && v != 1.0), "{bn}: {var:?}");
    }
}

/// A model whose first norm reads the input itself, so the expected statistics are the
/// input's: after two steps `r = 0.9 * (0.9 * r0 + 0.1 * batch) + 0.1 * batch`.
#[test]
fn the_update_is_pytorchs_with_the_unbiased_variance() {
    let src = "model bn {
  dim B = 4, C = 3, S = 6
  input x: [B, C, S, S]
  param bn: batchnorm(C)
  param conv: conv2d(C, C, 3)
  let y = conv2d(batchnorm(x, bn), conv, padding = 1)
  loss = mean(y * y)
  train {
    optimizer = sgd(lr = 0.1)
  }
}";
    let c = compiled_with(src, &Options::default());
    let mut ex = executor(&c, 5);
    let x = input(&ex);
    let (mean, var) = moments(&x, 36);
    for step in 1..=2 {
        ex.run_step(None).unwrap();
        let keep = 0.9f64.powi(step);
        for ch in 0..CHANNELS {
            let want_mean = (1.0 - keep) * mean[ch];
            let want_var = keep + (1.0 - keep) * var[ch];
            let got_mean = f64::from(read(&ex, "bn.running_mean")[ch]);
            let got_var = f64::from(read(&ex, "bn.running_var")[ch]);
            assert!(
                (got_mean - want_mean).abs() < 1e-6,
                "step {step} ch {ch}: {got_mean} vs {want_mean}"
            );
            assert!(
                (got_var - want_var).abs() < 1e-6,
                "step {step} ch {ch}: {got_var} vs {want_var}"
            );
        }
    }
}

/// Recomputing the norms in backward (per-block or pointwise checkpointing) and bf16 mixed
/// precision leave the statistics' update once per step: the statistics after three steps
/// equal keep-all's bit for bit (fp32) and stay fp32 beside bf16 activations.
#[test]
fn recomputation_does_not_update_twice_and_bf16_keeps_them_fp32() {
    let after = |options: &Options| {
        let c = compiled_with(&training(), options);
        let mut ex = executor(&c, 7);
        for _ in 0..3 {
            ex.run_step(None).unwrap();
        }
        let p = ex.plan().clone();
        let dtype = p
            .buffers
            .iter()
            .find(|b| b.name == "bn2.running_var")
            .unwrap()
            .ty
            .dtype;
        (
            read(&ex, "bn1.running_mean"),
            read(&ex, "bn2.running_var"),
            dtype,
        )
    };
    let keep_all = after(&Options {
        checkpoint: CheckpointMode::KeepAll,
        ..Options::default()
    });
    for mode in ["pointwise", "mincut"] {
        let recomputed = after(&Options {
            checkpoint: CheckpointMode::parse(mode).unwrap(),
            ..Options::default()
        });
        assert_eq!(recomputed, keep_all, "{mode}");
    }
    let bf16 = after(&Options {
        precision: Some(Precision::Bf16),
        ..Options::default()
    });
    assert_eq!(bf16.2, memc::ir::DType::F32);
    for (a, b) in bf16.1.iter().zip(&keep_all.1) {
        assert!(
            (a - b).abs() <= 0.02 * b.abs(),
            "{:?} vs {:?}",
            bf16.1,
            keep_all.1
        );
    }
}

/// Without `train { }` batch norm is eval mode: `(x - mean) / sqrt(var + eps) * w + b` per
/// channel from the running statistics, whatever the batch holds.
#[test]
fn an_inference_model_normalizes_with_the_running_statistics() {
    let src = "model bn {
  dim B = 2, C = 3, S = 4
  input x: [B, C, S, S]
  param bn: batchnorm(C)
  output y = batchnorm(x, bn, eps = 1e-3)
}";
    let c = compiled_with(src, &Options::default());
    assert_eq!(c.plan.plan().report.param_count, 6);
    let mut ex = executor(&c, 1);
    let plan = ex.plan().clone();
    let buffer = |name: &str| plan.params.iter().find(|p| p.name == name).unwrap().buffer;
    let stats: [(&str, [f32; 3]); 4] = [
        ("bn.weight", [1.5, -0.5, 2.0]),
        ("bn.bias", [0.25, 0.0, -1.0]),
        ("bn.running_mean", [0.5, -2.0, 0.0]),
        ("bn.running_var", [4.0, 0.25, 1.0]),
    ];
    for (name, v) in &stats {
        ex.write(buffer(name), v).unwrap();
    }
    let x = input(&ex);
    ex.run_step(None).unwrap();
    let y = ex.output("y").unwrap().to_vec();
    let plane = 16;
    for (i, (&xi, &yi)) in x.iter().zip(&y).enumerate() {
        let ch = (i / plane) % CHANNELS;
        let [w, b, m, v] = [0, 1, 2, 3].map(|k| f64::from(stats[k].1[ch]));
        let want = (f64::from(xi) - m) / (v + 1e-3).sqrt() * w + b;
        assert!((f64::from(yi) - want).abs() < 1e-5, "{i}: {yi} vs {want}");
    }
}

#[test]
fn running_statistics_are_reported_as_state_not_parameters() {
    let c = compiled_with(&training(), &Options::default());
    let plan = c.plan.plan();
    let role = |name: &str| {
        let b = plan.buffers.iter().find(|b| b.name == name).unwrap();
        b.role.clone()
    };
    assert_eq!(
        role("bn1.running_mean"),
        Some(memc::plan::Role::RunningStatistic)
    );
    assert_eq!(role("bn1.weight"), Some(memc::plan::Role::Parameter));
}
