//! Mixed precision: bf16/fp16 steps train like fp32, fp16 loss scaling skips overflowed steps,
//! the byte accounting of each precision is exact, and casts sit where the rules put them.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use common::{compiled_with, example, executor, loss, SMALL_GPT};
use memc::exec::cpu::CpuExecutor;
use memc::front::train::Precision;
use memc::plan::{BufferId, Plan};
use memc::Options;

fn with(precision: Precision, overrides: &[(&str, i64)]) -> Options {
    Options {
        precision: Some(precision),
        overrides: common::overrides(overrides),
        ..Options::default()
    }
}

/// The losses of `steps` steps of `model` in `precision`, from seed 7.
fn losses(model: &str, precision: Precision, overrides: &[(&str, i64)], steps: usize) -> Vec<f32> {
    let c = compiled_with(&example(model), &with(precision, overrides));
    let mut ex = executor(&c, 7);
    (0..steps).map(|_| loss(&mut ex)).collect()
}

/// Mixed-precision training follows the fp32 curve: every loss within `rel` of fp32's at the
/// same step, and the run learns as much.
fn tracks_fp32(model: &str, overrides: &[(&str, i64)], steps: usize, rel: f32) {
    let reference = losses(model, Precision::Fp32, overrides, steps);
    for precision in [Precision::Bf16, Precision::Fp16] {
        let got = losses(model, precision, overrides, steps);
        for (s, (&a, &b)) in got.iter().zip(&reference).enumerate() {
            assert!(
                (a - b).abs() <= rel * b.abs() + 1e-3,
                "{model} {precision:?} step {s}: loss {a} vs fp32 {b} (tolerance {rel} relative)\n{got:?}\n{reference:?}"
            );
        }
        let (first, last) = (got[0], got[steps - 1]);
        assert!(
            last < first - 0.5,
            "{model} {precision:?} went from {first} to {last}"
        );
    }
}

#[test]
fn mlp_in_bf16_and_fp16_tracks_fp32() {
    tracks_fp32("mlp", &[], 30, 0.05);
}

#[test]
fn small_gpt_in_bf16_and_fp16_tracks_fp32() {
    tracks_fp32("gpt2", SMALL_GPT, 15, 0.02);
}

fn state(plan: &Plan, name: &str) -> BufferId {
    plan.buffers
        .iter()
        .find(|b| b.name == name)
        .unwrap_or_else(|| panic!("no buffer {name}"))
        .id
}

fn persistent(ex: &CpuExecutor) -> Vec<Vec<f32>> {
    let plan = ex.plan();
    plan.params
        .iter()
        .map(|p| p.buffer)
        .chain(plan.optim_state.iter().map(|s| s.buffer))
        .map(|b| ex.read(b).into_owned())
        .collect()
}

#[test]
fn fp16_overflow_skips_the_update_and_halves_the_scale() {
    let c = compiled_with(&example("mlp"), &with(Precision::Fp16, &[]));
    let plan = c.plan.plan().clone();
    let summary = plan.report.precision.as_ref().expect("precision summary");
    assert!(summary.loss_scaling);
    let (scale, clean) = (
        state(&plan, "loss_scale"),
        state(&plan, "loss_scale.clean_steps"),
    );
    let mut ex = executor(&c, 3);

    // A scale of 2^30 makes the scaled logit gradients exceed fp16's 65504: inf. (The
    // weight gradients are computed in fp32, so large inputs alone no longer overflow.)
    ex.synthetic_inputs(3).unwrap();
    ex.write(scale, &[1_073_741_824.0]).unwrap();
    let before = persistent(&ex);
    ex.run_step(None).unwrap();
    assert_eq!(
        ex.read(scale)[0],
        536_870_912.0,
        "the scale halves on overflow"
    );
    assert_eq!(ex.read(clean)[0], 0.0);
    let after = persistent(&ex);
    let scale_at = plan
        .optim_state
        .iter()
        .position(|s| s.buffer == scale)
        .unwrap();
    for (k, (a, b)) in after.iter().zip(&before).enumerate() {
        if k != plan.params.len() + scale_at {
            assert!(
                a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "persistent buffer {k} changed on a skipped step"
            );
        }
    }

    // At the default scale the same batch updates the parameters and counts a clean step.
    ex.write(scale, &[32768.0]).unwrap();
    ex.run_step(None).unwrap();
    assert_eq!(ex.read(scale)[0], 32768.0);
    assert_eq!(ex.read(clean)[0], 1.0);
    assert_ne!(persistent(&ex)[0], before[0], "a clean step updates fc1");
}

#[test]
fn gpt2_bytes_per_precision_are_exact() {
    let fp32 = compiled_with(&example("gpt2"), &Options::default());
    let bf16 = compiled_with(&example("gpt2"), &with(Precision::Bf16, &[]));
    let fp16 = compiled_with(&example("gpt2"), &with(Precision::Fp16, &[]));
    let (a, b, h) = (
        &fp32.plan.plan().report,
        &bf16.plan.plan().report,
        &fp16.plan.plan().report,
    );
    let n = 124_439_808u64;
    for r in [a, b, h] {
        assert_eq!(r.param_count, n);
        assert_eq!(r.bytes.params, 4 * n, "fp32 master weights");
        assert_eq!(r.bytes.grads, 4 * n, "fp32 gradients of the master weights");
    }
    assert_eq!(a.bytes.optimizer, 8 * n, "two fp32 AdamW moments");
    assert_eq!(b.bytes.optimizer, 8 * n);
    assert_eq!(
        h.bytes.optimizer,
        8 * n + 8,
        "plus the loss scale and its counter"
    );
    assert!(a.precision.is_none());
    let copies = b.precision.as_ref().unwrap();
    // Every weight of a bf16 op is copied to bf16 once per step: the 12 layers' four linear
    // weights (12 D^2 in all) and biases (9 D), and the tied output projection (V x D).
    let (d, v) = (768u64, 50257u64);
    assert_eq!(copies.weight_copies, 12 * 8 + 1);
    assert_eq!(
        copies.weight_copy_bytes,
        2 * (12 * (12 * d * d + 9 * d) + v * d)
    );
    let ratio = b.bytes.activations as f64 / a.bytes.activations as f64;
    assert!(
        (0.45..0.65).contains(&ratio),
        "bf16 saved activations {} vs fp32 {}: ratio {ratio}",
        b.bytes.activations,
        a.bytes.activations
    );
    assert_eq!(h.bytes.activations, b.bytes.activations);
}

#[test]
fn cast_placement_in_a_transformer_block() {
    let src = r#"
model tblock {
  dim B = 2, T = 4, D = 8, H = 2, V = 16
  input tokens: i32[B, T]
  input targets: i32[B, T]
  param wte: [V, D] = normal(0.02)
  param ln: layernorm(D)
  param qkv: linear(D, 3*D)
  param proj: linear(D, D)
  let x = embed(wte, tokens)
  let q, k, v = split(linear(layernorm(x, ln), qkv), 3, axis = -1)
  x = x + linear(attention(q, k, v, heads = H, causal = true), proj)
  loss = cross_entropy(x @ transpose(wte), targets)
  train { optimizer = adamw(lr = 1e-3) precision = bf16 }
}
"#;
    let ast = memc::front::parse(src).unwrap();
    let module = memc::front::lower(&ast, &[]).unwrap();
    let loss = module.graph.output("loss").unwrap();
    let mixed = memc::passes::precision::run(&module.graph, loss, Precision::Bf16, true).unwrap();
    insta::assert_snapshot!(memc::ir::print(&mixed.graph));
}

#[test]
fn pure_bf16_stores_parameters_in_bf16_and_trains() {
    let options = Options {
        master_weights: Some(false),
        ..with(Precision::Bf16, &[])
    };
    let c = compiled_with(&example("mlp"), &options);
    let report = &c.plan.plan().report;
    let n = report.param_count;
    assert_eq!(
        report.bytes.params,
        2 * n,
        "bf16 parameters, no fp32 masters"
    );
    assert_eq!(report.bytes.grads, 2 * n, "bf16 gradients");
    assert_eq!(report.bytes.optimizer, 8 * n, "fp32 AdamW moments");
    assert_eq!(
        report.precision.as_ref().unwrap().weight_copy_bytes,
        0,
        "no weight needs a copy"
    );
    let mut ex = executor(&c, 7);
    let first = loss(&mut ex);
    let mut last = first;
    for _ in 0..30 {
        last = loss(&mut ex);
    }
    assert!(last < first - 0.5, "pure bf16 went from {first} to {last}");
}

#[test]
fn fp16_without_master_weights_is_refused() {
    let options = Options {
        master_weights: Some(false),
        ..with(Precision::Fp16, &[])
    };
    assert_eq!(
        common::user_error(&example("mlp"), &options).message,
        "master_weights = off needs bf16, not fp16"
    );
}

/// Each parameter's first-step gradient of the UNet example, from seed 3.
fn unet_gradients(precision: Precision) -> std::collections::BTreeMap<String, Vec<f32>> {
    let c = compiled_with(&example("unet"), &with(precision, &[("B", 2)]));
    let mut ex = executor(&c, 3);
    let mut grads = std::collections::BTreeMap::new();
    ex.run_step(Some(&mut |name: &str, g: &[f32]| {
        grads.insert(name.to_string(), g.to_vec());
    }))
    .unwrap();
    grads
}

/// Group norm runs in its input's precision (statistics and arithmetic in fp32, the output
/// rounded once), so a bf16 UNet saves the norms' bf16 inputs. Its gradients stay as close to
/// fp32 as with the norms computed on fp32 copies: relative L2 error per parameter 1.09%
/// median, 2.42% at most at B=4 (1.01% and 2.07% with fp32 norms); asserted here at 2% and 4%.
#[test]
fn unet_gradients_in_bf16_track_fp32() {
    let (reference, got) = (
        unet_gradients(Precision::Fp32),
        unet_gradients(Precision::Bf16),
    );
    assert_eq!(reference.len(), got.len());
    let errors = common::relative_errors(&reference, &got);
    let median = errors[errors.len() / 2].0;
    let worst = errors[errors.len() - 1];
    assert!(median <= 0.02, "median relative error {median}: {errors:?}");
    assert!(worst.0 <= 0.04, "worst relative error {worst:?}");
}
