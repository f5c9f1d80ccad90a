//! Gradient accumulation: A micro-batches of B/A train exactly as one batch of B (up to float
//! summation order), gradients accumulate in persistent fp32 buffers, and `fit` finds the
//! largest micro-batch that fits.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use common::{compiled_with, example, loss};
use memc::exec::cpu::CpuExecutor;
use memc::fit::fit_accumulation;
use memc::Options;

fn options(overrides: &[(&str, i64)], accumulate: u32) -> Options {
    Options {
        overrides: common::overrides(overrides),
        accumulate: Some(accumulate),
        ..Options::default()
    }
}

/// An executor over `model` with `dims` and batch `batch`, accumulating `accumulate`
/// micro-batches, with parameters from seed 11 and inputs copied from `data` (or synthetic
/// from seed 5 when `data` is None).
fn executor(
    model: &str,
    dims: &[(&str, i64)],
    batch: i64,
    accumulate: u32,
    data: Option<&CpuExecutor>,
) -> CpuExecutor {
    let mut overrides = dims.to_vec();
    overrides.push(("B", batch));
    let c = compiled_with(&example(model), &options(&overrides, accumulate));
    let mut ex = CpuExecutor::new(&c.plan).unwrap();
    ex.init_params(11).unwrap();
    let Some(data) = data else {
        ex.synthetic_inputs(5).unwrap();
        return ex;
    };
    for input in &data.plan().inputs {
        let mine = ex
            .plan()
            .inputs
            .iter()
            .find(|i| i.name == input.name)
            .unwrap();
        ex.bind_input(mine.buffer, data.read(input.buffer).into_owned())
            .unwrap();
    }
    ex
}

/// Trains `steps` steps of the full batch and of `accumulate` micro-batches on the same data
/// side by side and compares the losses and every parameter.
fn matches_full_batch(
    model: &str,
    dims: &[(&str, i64)],
    batch: i64,
    accumulate: u32,
    steps: usize,
) {
    let mut full = executor(model, dims, batch, 1, None);
    let micro = batch / i64::from(accumulate);
    let mut acc = executor(model, dims, micro, accumulate, Some(&full));
    assert_eq!(acc.micro_steps(), accumulate);
    for s in 0..steps {
        let (a, b) = (loss(&mut full), loss(&mut acc));
        assert!(
            (a - b).abs() <= 1e-5 * a.abs().max(1.0),
            "{model} step {s}: full-batch loss {a} vs accumulated {b}"
        );
    }
    for (p, q) in full.plan().params.iter().zip(&acc.plan().params) {
        assert_eq!(p.name, q.name);
        let (x, y) = (full.read(p.buffer), acc.read(q.buffer));
        let worst = x
            .iter()
            .zip(y.iter())
            .map(|(u, v)| (u - v).abs())
            .fold(0.0f32, f32::max);
        assert!(worst <= 1e-5, "{model}: `{}` differs by {worst}", p.name);
    }
}

#[test]
fn four_micro_batches_train_as_one_batch() {
    matches_full_batch("mlp", &[], 64, 4, 3);
}

#[test]
fn small_gpt_accumulates_like_the_full_batch() {
    let dims = [("L", 1), ("D", 32), ("T", 8), ("V", 64), ("H", 2)];
    matches_full_batch("gpt2", &dims, 4, 4, 2);
}

#[test]
fn accumulators_are_persistent_and_activations_shrink() {
    let full = compiled_with(&example("mlp"), &options(&[], 1));
    let micro = compiled_with(&example("mlp"), &options(&[("B", 16)], 4));
    let (f, m) = (&full.plan.plan().report, &micro.plan.plan().report);
    let n = f.param_count;
    assert_eq!(m.bytes.grads, 4 * n, "one fp32 accumulator per parameter");
    assert_eq!(m.bytes.optimizer, 8 * n);
    assert_eq!(
        4 * m.bytes.activations,
        f.bytes.activations,
        "saved activations scale with the micro-batch"
    );
    assert!(!m.optimizer_in_backward);
    let plan = micro.plan.plan();
    for b in plan
        .buffers
        .iter()
        .filter(|b| b.name.ends_with(".grad_acc"))
    {
        assert_eq!((b.first, b.last), (0, plan.steps.len() - 1), "{}", b.name);
    }
}

#[test]
fn accumulation_refuses_the_optimizer_in_backward() {
    let o = Options {
        optimizer_in_backward: Some(true),
        ..options(&[], 2)
    };
    assert_eq!(
        common::user_error(&example("mlp"), &o).message,
        "the optimizer cannot run in backward with gradient accumulation"
    );
}

#[test]
fn fit_finds_the_largest_micro_batch() {
    let budget = 4u64 << 30;
    let o = Options {
        checkpoint: memc::budget::CheckpointMode::KeepAll,
        ..Options::default()
    };
    let r = fit_accumulation(&example("gpt2"), &o, "B", budget, &mut |_| {}).unwrap();
    assert_eq!((r.batch, r.micro_batch, r.accumulate), (8, 2, 4));
    assert!(r.arena_bytes <= budget);
    assert_eq!(r.plan.plan().train.as_ref().unwrap().accumulate, 4);
    let next = r.next.expect("B=4 was compiled first");
    assert_eq!(next.value, 4);
    assert!(
        next.arena_bytes > budget,
        "B=4 x 2 needs {}",
        next.arena_bytes
    );
}
