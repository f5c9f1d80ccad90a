//! `memc run --save-state` / `--load-state`: a run stopped and resumed continues bitwise as
//! an uninterrupted one (parameters, AdamW moments (fp32 or 8-bit) and step count, the fp16
//! loss scale, stochastic rounding's random bits,
//! dropout masks keyed by the step number), and a state is refused for another plan or seed.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use common::{memc, scratch};
use std::path::Path;

/// A classifier with dropout, trained by AdamW in fp16 (so a loss scale is state too).
const MODEL: &str = "model m {
  dim B = 4, I = 8, H = 16, K = 5
  input x: f32[B, I]
  input y: i32[B]
  param fc1: linear(I, H)
  param fc2: linear(H, K)
  loss = cross_entropy(linear(dropout(relu(linear(x, fc1)), p = 0.25), fc2), y)
  train { optimizer = adamw(lr = 1e-2) precision = fp16 }
}
";

/// Runs `memc run model` with `args`, returning its printed losses ("step N loss X" lines).
fn run(model: &Path, args: &[&str]) -> Vec<String> {
    let mut all = vec!["run", model.to_str().unwrap(), "--seed", "7"];
    all.extend(args);
    common::step_lines(&common::stdout_of(&all))
}

#[test]
fn a_resumed_run_equals_an_uninterrupted_one_bitwise() {
    resumes_bitwise("resume", MODEL);
}

/// The same with AdamW's 8-bit moments (u8 codes and f32 absmaxes saved as f32 values) and
/// pure bf16 updates rounded stochastically (random bits keyed by the step number).
#[test]
fn a_resumed_run_with_int8_state_and_stochastic_rounding_equals_an_uninterrupted_one() {
    let model = MODEL.replace(
        "adamw(lr = 1e-2) precision = fp16",
        "adamw(lr = 1e-2, state = int8) precision = bf16 master_weights = off \
         stochastic_rounding = true",
    );
    assert_ne!(model, MODEL);
    resumes_bitwise("resume-int8", &model);
}

/// Five steps in one run equal two, saved with --save-state, then three resumed with
/// --load-state: the same losses and bitwise the same parameters.
fn resumes_bitwise(name: &str, src: &str) {
    let dir = scratch(name);
    let model = dir.join("m.mdl");
    std::fs::write(&model, src).unwrap();
    let path = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let whole = run(
        &model,
        &["--steps", "5", "--save-params", &path("whole.safetensors")],
    );
    assert_eq!(whole.len(), 5);
    let first = run(
        &model,
        &["--steps", "2", "--save-state", &path("state.safetensors")],
    );
    let rest = run(
        &model,
        &[
            "--steps",
            "3",
            "--load-state",
            &path("state.safetensors"),
            "--save-params",
            &path("resumed.safetensors"),
        ],
    );
    assert_eq!([first, rest].concat(), whole, "losses differ");
    let whole = std::fs::read(dir.join("whole.safetensors")).unwrap();
    let resumed = std::fs::read(dir.join("resumed.safetensors")).unwrap();
    assert!(whole == resumed, "parameters differ after 5 steps");
}

#[test]
fn a_state_is_refused_for_another_plan_or_seed() {
    let dir = scratch("refuse");
    let model = dir.join("m.mdl");
    std::fs::write(&model, MODEL).unwrap();
    let state = dir.join("state.safetensors");
    let state = state.to_str().unwrap();
    run(&model, &["--save-state", state]);
    let refused = |args: &[&str], needle: &str| {
        let mut all = vec!["run", model.to_str().unwrap(), "--load-state", state];
        all.extend(args);
        let out = memc(&all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(needle), "{stderr}");
    };
    refused(&["--seed", "8"], "pass it again");
    refused(
        &["--seed", "7", "--precision", "fp32"],
        "other parameters or optimizer state",
    );
    refused(
        &["--seed", "7", "--set", "H=17"],
        "other parameters or optimizer state",
    );
    refused(&["--seed", "7", "--params", state], "cannot be used with");
    let params = dir.join("params.safetensors");
    run(
        &model,
        &["--steps", "1", "--save-params", params.to_str().unwrap()],
    );
    let mut all = vec![
        "run",
        model.to_str().unwrap(),
        "--seed",
        "7",
        "--load-state",
    ];
    all.push(params.to_str().unwrap());
    let out = memc(&all);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a state saved by --save-state"));
}
