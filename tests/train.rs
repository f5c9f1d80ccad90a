//! End-to-end training on the CPU backend: losses fall, and the arena layout changes nothing
//! numerically compared with giving every buffer its own bytes.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use common::{compiled_with, example, executor, loss};
use memc::plan::verify;
use memc::Options;

fn small_gpt() -> Options {
    Options {
        overrides: common::overrides(common::SMALL_GPT),
        ..Options::default()
    }
}

#[test]
fn mlp_memorizes_a_fixed_batch() {
    let c = compiled_with(&example("mlp"), &Options::default());
    let mut ex = executor(&c, 1);
    let first = loss(&mut ex);
    let mut last = first;
    for _ in 0..50 {
        last = loss(&mut ex);
    }
    assert!(first > 2.0, "initial loss {first} should be near ln(10)");
    assert!(
        last < first / 100.0,
        "loss went from {first} to {last}: expected a 100x drop in 50 steps"
    );
}

#[test]
fn small_gpt_trains() {
    let c = compiled_with(&example("gpt2"), &small_gpt());
    let mut ex = executor(&c, 3);
    let first = loss(&mut ex);
    let mut last = first;
    for _ in 0..15 {
        last = loss(&mut ex);
    }
    assert!(
        (first - (256f32).ln()).abs() < 0.5,
        "initial loss {first} should be near ln(256)"
    );
    assert!(last < first - 0.5, "loss went from {first} to {last}");
}

#[test]
fn arena_reuse_is_bitwise_identical_to_no_reuse() {
    let c = compiled_with(&example("gpt2"), &small_gpt());
    let mut separate = c.plan.plan().clone();
    let mut offset = 0;
    for b in separate.buffers.iter_mut().filter(|b| b.view_of.is_none()) {
        b.offset = offset;
        offset += b.bytes.div_ceil(256) * 256;
    }
    // A view keeps its root's bytes.
    for i in 0..separate.buffers.len() {
        if let Some(root) = separate.buffers[i].view_of {
            separate.buffers[i].offset = separate.buffers[root.index()].offset;
        }
    }
    separate.arena_bytes = offset;
    assert!(
        offset > c.plan.plan().arena_bytes,
        "the arena must reuse bytes"
    );
    let separate = verify(separate).expect("no-reuse plan verifies");
    let mut a = executor(&c, 5);
    let mut b = memc::exec::cpu::CpuExecutor::new(&separate).expect("cpu");
    b.init_params(5).expect("init");
    b.synthetic_inputs(5).expect("inputs");
    for _ in 0..3 {
        assert_eq!(loss(&mut a).to_bits(), loss(&mut b).to_bits());
    }
    for p in &c.plan.plan().params {
        let same = a
            .read(p.buffer)
            .iter()
            .zip(b.read(p.buffer).iter())
            .all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "parameter {} differs", p.name);
    }
}

#[test]
fn optimizer_in_backward_frees_gradients_early() {
    let src = example("mlp");
    let on = compiled_with(
        &src,
        &Options {
            optimizer_in_backward: Some(true),
            ..Options::default()
        },
    );
    let off = compiled_with(
        &src,
        &Options {
            optimizer_in_backward: Some(false),
            ..Options::default()
        },
    );
    let (on, off) = (&on.plan.plan().report.bytes, &off.plan.plan().report.bytes);
    assert!(
        on.peak < off.peak,
        "peak with updates in backward {} vs after {}",
        on.peak,
        off.peak
    );
    assert_eq!(on.grads, off.grads);
}

/// An inference model (no `train { }`) runs dropout as the identity, as PyTorch's eval mode:
/// the plan has no dropout step and its output is bitwise the model's without dropout.
#[test]
fn inference_dropout_is_the_identity() {
    let with = "model m {\n  input x: [4, 8]\n  param w: [8, 8] = normal(1.0)\n  output y = dropout(x @ w, p = 0.5)\n}\n";
    let without = with.replace("dropout(x @ w, p = 0.5)", "x @ w");
    let output = |src: &str| {
        let c = compiled_with(src, &Options::default());
        assert!(!c
            .plan
            .plan()
            .steps
            .iter()
            .any(|s| matches!(s.op, memc::ir::Op::Dropout { .. })));
        let mut ex = executor(&c, 3);
        ex.run_step(None).unwrap();
        ex.output("y").unwrap().to_vec()
    };
    let (a, b) = (output(with), output(&without));
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    assert_eq!(a.len(), 32);
}

/// The run's seed keys the dropout masks: the same weights and batch give the same loss
/// under the same seed and a different one under another seed (`memc run --seed`).
#[test]
fn the_run_seed_draws_the_dropout_masks() {
    let src = "model m {\n  input x: [16, 32]\n  param w: [32, 32] = normal(1.0)\n  loss = mean(dropout(x @ w, p = 0.5))\n  train { optimizer = sgd(lr = 0.0) }\n}\n";
    let c = compiled_with(src, &Options::default());
    let loss_with = |seed: u64| {
        let mut ex = executor(&c, 3);
        ex.set_seed(seed);
        loss(&mut ex)
    };
    assert_eq!(loss_with(7).to_bits(), loss_with(7).to_bits());
    assert_ne!(loss_with(7), loss_with(8));
    assert_ne!(loss_with(0), loss_with(7));
}
