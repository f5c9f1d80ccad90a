//! Frozen parameters (`param ... frozen`, `--freeze PATTERN`): no gradient, no optimizer
//! state, exact bytes; the trained parameters get the same gradients as without freezing,
//! and the frozen ones never move.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use common::{compiled_with, example, executor};
use memc::{compile, CompileError, Options};
use std::collections::HashMap;
use std::time::Duration;

fn frozen(patterns: &[&str]) -> Options {
    Options {
        freeze: patterns.iter().map(|p| p.to_string()).collect(),
        ..Options::default()
    }
}

/// The gradients the updates see in the first step, by parameter name.
fn first_gradients(c: &memc::Compiled) -> HashMap<String, Vec<u32>> {
    let mut ex = executor(c, 5);
    let mut grads = HashMap::new();
    ex.run_step(Some(&mut |name: &str, g: &[f32]| {
        grads.insert(name.to_string(), g.iter().map(|v| v.to_bits()).collect());
    }))
    .unwrap();
    grads
}

#[test]
fn freezing_fc1_leaves_only_fc2_trained_with_exact_bytes() {
    let src = example("mlp");
    let (all, part) = (
        compiled_with(&src, &Options::default()),
        compiled_with(&src, &frozen(&["fc1.*"])),
    );
    let r = &part.plan.plan().report;
    let fc2 = 256 * 10 + 10;
    assert_eq!((r.param_count, r.trainable_param_count), (203_530, fc2));
    // fp32 AdamW: a 4-byte gradient and two 4-byte moments per trained parameter.
    assert_eq!(r.bytes.grads, 4 * fc2);
    assert_eq!(r.bytes.optimizer, 8 * fc2);
    assert_eq!(r.bytes.params, all.plan.plan().report.bytes.params);
    assert!(r.bytes.arena < all.plan.plan().report.bytes.arena);
    // fc2's gradients are bitwise those of the unfrozen step; fc1 gets none.
    let (g_all, g_part) = (first_gradients(&all), first_gradients(&part));
    assert_eq!(
        g_part.keys().collect::<std::collections::BTreeSet<_>>(),
        ["fc2.bias", "fc2.weight"]
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .iter()
            .collect()
    );
    for (name, g) in &g_part {
        assert_eq!(g, &g_all[name], "{name}");
    }
}

#[test]
fn frozen_parameters_never_move_and_the_keyword_equals_the_flag() {
    let src = example("mlp").replace(
        "param  fc1: linear(IN, H)",
        "param  fc1: linear(IN, H) frozen",
    );
    // Without the layout search, whose proven bound depends on how far its wall-clock cap
    // let it get.
    let quick = |o: Options| Options {
        layout_time: Duration::ZERO,
        ..o
    };
    let keyword = compiled_with(&src, &quick(Options::default()));
    let flag = compiled_with(&example("mlp"), &quick(frozen(&["fc1.*"])));
    assert_eq!(
        keyword.plan.plan().report.bytes,
        flag.plan.plan().report.bytes
    );
    let mut ex = executor(&keyword, 2);
    let plan = ex.plan().clone();
    let buffer = |name: &str| plan.params.iter().find(|p| p.name == name).unwrap().buffer;
    let before: Vec<Vec<f32>> = ["fc1.weight", "fc1.bias", "fc2.weight"]
        .iter()
        .map(|n| ex.read(buffer(n)).to_vec())
        .collect();
    for _ in 0..3 {
        ex.run_step(None).unwrap();
    }
    assert_eq!(ex.read(buffer("fc1.weight")).to_vec(), before[0]);
    assert_eq!(ex.read(buffer("fc1.bias")).to_vec(), before[1]);
    assert_ne!(ex.read(buffer("fc2.weight")).to_vec(), before[2]);
}

#[test]
fn a_pattern_that_matches_nothing_is_a_user_error() {
    match compile(&example("mlp"), &frozen(&["fc3*"])) {
        Err(CompileError::User(e)) => {
            assert!(
                e.message.contains("`--freeze fc3*` matches no parameter"),
                "{}",
                e.message
            );
            assert!(e.help.contains("fc1.weight"), "{}", e.help);
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
}
