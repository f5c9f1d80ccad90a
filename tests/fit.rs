//! `memc fit`: the value found fits the budget and the next one does not (both recompiled
//! here, independently of the search), infeasible and unknown dims fail, and the CLI answers.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use common::{assert_success, memc, MLP};
use memc::fit::{fit_dim, fit_dim_with, FitError};
use memc::{compile, CompileError, Options};
use std::path::Path;
use std::time::Duration;

fn source(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// No layout search time: every compile of a value gives the same arena, so the test's
/// recompiles reproduce the search's.
fn options(sets: &[(&str, i64)]) -> Options {
    Options {
        overrides: sets.iter().map(|&(k, v)| (k.to_string(), v)).collect(),
        layout_time: Duration::ZERO,
        ..Options::default()
    }
}

const SMALL_GPT2: [(&str, i64); 5] = [("L", 2), ("D", 64), ("T", 32), ("V", 256), ("H", 4)];

/// The arena at `dim = value` under `budget`, or None when no plan within it exists.
fn arena_at(src: &str, base: &Options, dim: &str, value: i64, budget: u64) -> Option<u64> {
    let mut o = base.clone();
    o.overrides.retain(|(n, _)| n != dim);
    o.overrides.push((dim.to_string(), value));
    o.budget = Some(budget);
    match compile(src, &o) {
        Ok(c) => Some(c.plan.plan().arena_bytes),
        Err(CompileError::User(e)) => {
            // Must be the budget, not some other problem: without one it compiles.
            o.budget = Some(u64::MAX);
            let free = compile(src, &o).unwrap_or_else(|_| panic!("{dim}={value}: {e:?}"));
            assert!(free.plan.plan().arena_bytes > budget);
            None
        }
        Err(CompileError::Internal(e)) => panic!("internal at {dim}={value}: {e:?}"),
    }
}

fn check_fit(name: &str, sets: &[(&str, i64)], dim: &str, budget: u64) -> i64 {
    let src = source(name);
    let opts = options(sets);
    let r = fit_dim(&src, &opts, dim, budget).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(r.dim, dim);
    assert!(r.value >= 1);
    assert!(
        r.arena_bytes <= budget,
        "{name}: {} > {budget}",
        r.arena_bytes
    );
    assert!(r.next_arena_bytes > budget);
    assert_eq!(r.plan.plan().arena_bytes, r.arena_bytes);
    let at = arena_at(&src, &opts, dim, r.value, budget)
        .unwrap_or_else(|| panic!("{name}: {dim}={} does not fit on recompile", r.value));
    assert!(at <= budget);
    assert_eq!(at, r.arena_bytes, "{name}: recompile at {dim}={}", r.value);
    if let Some(next) = arena_at(&src, &opts, dim, r.value + 1, budget) {
        panic!(
            "{name}: {dim}={} fits too ({next} <= {budget})",
            r.value + 1
        );
    }
    r.value
}

#[test]
fn mlp_batch_fits_and_the_next_does_not() {
    let b = check_fit("mlp.mdl", &[], "B", 10 << 20);
    // Grows past the file's B = 64: the exponential probe went up.
    assert!(b > 64, "B = {b}");
}

#[test]
fn mlp_batch_below_the_file_value() {
    // 3.2 MiB: the file's B = 64 does not fit (3.1 MiB at B = 1), so the search goes down.
    let b = check_fit("mlp.mdl", &[], "B", 3_300_000);
    assert!(b < 64, "B = {b}");
}

#[test]
fn small_gpt2_batch_fits_and_the_next_does_not() {
    check_fit("gpt2.mdl", &SMALL_GPT2, "B", 64 << 20);
}

/// `--multiple-of 8`: the answer is the largest multiple of 8 that fits (the next multiple
/// does not, both recompiled here), at most the unconstrained answer and within 7 of it.
#[test]
fn multiple_of_searches_only_multiples() {
    let (src, opts, budget) = (source("gpt2.mdl"), options(&SMALL_GPT2), 64 << 20);
    let free = fit_dim(&src, &opts, "B", budget).unwrap().value;
    let r = fit_dim_with(&src, &opts, ("B", 8), budget, &mut |p| {
        assert_eq!(p.value % 8, 0, "probed B={}", p.value)
    })
    .unwrap();
    assert_eq!((r.value % 8, r.next_value), (0, r.value + 8));
    assert!(
        r.value <= free && free - r.value < 8,
        "{} vs {free}",
        r.value
    );
    assert!(arena_at(&src, &opts, "B", r.value, budget).is_some_and(|a| a <= budget));
    assert!(arena_at(&src, &opts, "B", r.next_value, budget).is_none_or(|a| a > budget));
}

#[test]
fn small_gpt2_layers_fit_and_the_next_do_not() {
    check_fit("gpt2.mdl", &SMALL_GPT2, "L", 16 << 20);
}

#[test]
fn infeasible_budget_names_the_arena_at_one() {
    let src = source("mlp.mdl");
    match fit_dim(&src, &options(&[]), "B", 1 << 20) {
        Err(FitError::Infeasible {
            arena_bytes,
            budget,
            ref bytes,
            ..
        }) => {
            assert!(arena_bytes > budget);
            assert_eq!(budget, 1 << 20);
            assert_eq!(bytes.dominant_part().0, "optimizer state");
        }
        other => panic!("expected Infeasible, got {other:?}"),
    }
    let gpt2 = source("gpt2.mdl");
    let e = fit_dim(&gpt2, &options(&SMALL_GPT2), "B", 1 << 10).unwrap_err();
    assert!(matches!(e, FitError::Infeasible { .. }), "{e:?}");
    assert!(e.to_string().contains("B=1"), "{e}");
}

#[test]
fn unknown_dim_lists_the_dims() {
    let src = source("mlp.mdl");
    match fit_dim(&src, &options(&[]), "Q", 1 << 30) {
        Err(FitError::UnknownDim { known, .. }) => assert_eq!(known, ["B", "IN", "H", "C"]),
        other => panic!("expected UnknownDim, got {other:?}"),
    }
}

#[test]
fn cli_json_and_text() {
    let out = memc(&[
        "fit",
        MLP,
        "--budget",
        "10MiB",
        "--format",
        "json",
        "--layout-time",
        "0",
    ]);
    assert_success(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["dim"], "B");
    let value = v["value"].as_i64().unwrap();
    let lib = fit_dim(&source("mlp.mdl"), &options(&[]), "B", 10 << 20).unwrap();
    assert_eq!(value, lib.value);
    assert!(v["arena_bytes"].as_u64().unwrap() <= 10 << 20);
    assert!(v["next_arena_bytes"].as_u64().unwrap() > 10 << 20);

    let out = memc(&["fit", MLP, "--budget", "10MiB", "--layout-time", "0"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("is {value}")), "{text}");
    assert!(text.contains(&format!("B={}", value + 1)), "{text}");
    assert!(text.contains("model mlp (training step)"), "{text}");
}

#[test]
fn cli_infeasible_exits_2_with_the_arena_at_one() {
    let out = memc(&["fit", MLP, "--budget", "1MiB"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("even B=1 needs an arena of"), "{err}");
    assert!(err.contains("optimizer state dominates"), "{err}");
    let out = memc(&["fit", MLP]);
    assert_eq!(out.status.code(), Some(2));
}

/// An fp32 step whose precision no flag sets also gets the answer in bf16 mixed precision
/// (the library's search with `--precision bf16`), beside the fp32 answer, not instead of it;
/// `--precision` given on the command line turns that off.
#[test]
fn cli_reports_the_answer_in_bf16_beside_the_fp32_one() {
    let args = ["fit", MLP, "--budget", "10MiB", "--layout-time", "0"];
    let json = |extra: &[&str]| -> serde_json::Value {
        let out = memc(&[&args[..], &["--format", "json"], extra].concat());
        assert_success(&out);
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let v = json(&[]);
    let bf16 = Options {
        precision: Some(memc::settings::Precision::Bf16),
        ..options(&[])
    };
    let lib = fit_dim(&source("mlp.mdl"), &bf16, "B", 10 << 20).unwrap();
    assert_eq!(v["with_bf16"]["value"].as_i64(), Some(lib.value));
    assert_eq!(
        v["with_bf16"]["arena_bytes"].as_u64(),
        Some(lib.arena_bytes)
    );
    assert!(lib.value > v["value"].as_i64().unwrap(), "{v}");
    assert!(json(&["--precision", "fp32"])["with_bf16"].is_null());
    let out = memc(&args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "with --precision bf16 (fp32 master weights and optimizer state): B={}",
            lib.value
        )),
        "{text}"
    );
}

/// Heads must divide the width (64): a value that breaks the rule does not end the search
/// but counts as not fitting, and the answer is the largest head count found that compiles
/// and fits, with the refusal named at the next value.
#[test]
fn values_that_do_not_compile_count_as_not_fitting() {
    let src = source("gpt2.mdl");
    let r = fit_dim(&src, &options(&SMALL_GPT2), "H", 1 << 40).unwrap();
    assert_eq!(r.value, 64);
    assert_eq!(r.next_value, 65);
    let why = r.next_refusal.as_deref().unwrap_or_default();
    assert!(why.contains("heads"), "{why}");
    assert!(r.probes.iter().any(|p| p.refused && p.arena_bytes == 0));
    assert!(r
        .probes
        .iter()
        .filter(|p| !p.refused)
        .all(|p| p.arena_bytes > 0));
    let out = memc(&[
        "fit",
        "examples/gpt2.mdl",
        "--dim",
        "H",
        "--budget",
        "1TiB",
        "--set",
        "L=2",
        "--set",
        "D=64",
        "--set",
        "T=32",
        "--set",
        "V=256",
        "--set",
        "H=4",
    ]);
    assert_success(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("largest H within"), "{text}");
    assert!(text.contains("H=65: does not compile"), "{text}");
}
