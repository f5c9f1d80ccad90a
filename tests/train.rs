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
