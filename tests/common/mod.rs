//! Helpers shared by integration tests: compile a source, run steps on the CPU, run the
//! `memc` binary.
#![allow(dead_code, clippy::panic)]

use memc::exec::cpu::CpuExecutor;
use memc::{compile, Compiled, Options};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// Every new volume op in one shallow model: 3-D convolutions (grouped, unequal kernel and
/// padding), batch and group norm over NCDHW, 3-D max and average pooling, a transposed 3-D
/// convolution, upsampling and a skip.
pub const VOLUME_OPS: &str = "model volume_ops {
  dim B = 2, S = 8, C = 8
  input volume: [B, 1, S, S, S]
  input labels: i32[B, S, S, S]
  param c1: conv3d(1, C, 3)
  param n1: batchnorm(C)
  param c2: conv3d(C, C, (3, 1, 3), groups = 2)
  param n2: groupnorm(4, C)
  param t: conv_transpose3d(C, C, 2)
  param head: conv3d(C, 4, 1, bias = true)
  let h = relu(batchnorm(conv3d(volume, c1, padding = 1), n1))
  let p = max_pool3d(conv3d(h, c2, padding = (1, 0, 1)), 2)
  p = avg_pool3d(p, 3, stride = 1, padding = 1)
  let u = relu(groupnorm(conv_transpose3d(p, t, stride = 2), n2)) + h
  u = upsample(avg_pool3d(u, 2), 2)
  let logits = permute(reshape(conv3d(u, head), (B, 4, S*S*S)), (0, 2, 1))
  loss = cross_entropy(logits, reshape(labels, (B, S*S*S)))
  train { optimizer = adamw(lr = 1e-3) }
}
";

/// The source of `examples/NAME.mdl`.
pub fn example(name: &str) -> String {
    let path = format!("{}/examples/{name}.mdl", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A GPT-2 small enough to train in tests: 2 layers, D=64, T=32, V=256, 4 heads, B=4.
pub const SMALL_GPT: &[(&str, i64)] = &[
    ("L", 2),
    ("D", 64),
    ("T", 32),
    ("V", 256),
    ("H", 4),
    ("B", 4),
];

/// The GPT-2 the tensor and pipeline tests train: 2 layers, D=64, T=16, V=128, 4 heads.
pub const PARALLEL_GPT: &[(&str, i64)] = &[("L", 2), ("D", 64), ("T", 16), ("V", 128), ("H", 4)];

/// The LLaMA the tensor and pipeline tests train, with grouped-query attention: 4 heads, 2
/// key/value heads.
pub const PARALLEL_LLAMA: &[(&str, i64)] = &[
    ("L", 2),
    ("D", 64),
    ("T", 16),
    ("V", 128),
    ("H", 4),
    ("KV", 2),
    ("F", 96),
];

/// Overrides for a GPT-2 that compiles in moments: 4 layers, D=32, T=16, V=64, 4 heads,
/// batch `batch`.
pub fn tiny_gpt(batch: i64) -> Vec<(String, i64)> {
    overrides(&[
        ("L", 4),
        ("D", 32),
        ("T", 16),
        ("V", 64),
        ("H", 4),
        ("B", batch),
    ])
}

/// `--set` style overrides from `(name, value)` pairs.
pub fn overrides(dims: &[(&str, i64)]) -> Vec<(String, i64)> {
    dims.iter().map(|&(k, v)| (k.to_string(), v)).collect()
}

/// The losses of `steps` steps of all ranks of the plan `options` compile for
/// `examples/MODEL.mdl`, from seed 3 (`memc::exec::ranks::Ranks`).
pub fn rank_losses(model: &str, options: &Options, steps: usize) -> Vec<f32> {
    let c = compiled_with(&example(model), options);
    let mut ranks = memc::exec::ranks::Ranks::new(&c.plan).unwrap_or_else(|e| panic!("{e}"));
    ranks.start(3).unwrap_or_else(|e| panic!("{e}"));
    (0..steps)
        .map(|_| match ranks.run_step() {
            Ok(Some(loss)) => loss,
            Ok(None) => panic!("{model}: no loss"),
            Err(e) => panic!("{model}: {e}"),
        })
        .collect()
}

/// Fails unless `many` has the losses of `one`, step by step, within `tolerance` of each
/// (relative); `what` names the run in the failure.
pub fn assert_losses_close(one: &[f32], many: &[f32], tolerance: f32, what: &str) {
    assert_eq!(one.len(), many.len(), "{what}: steps");
    for (step, (a, b)) in one.iter().zip(many).enumerate() {
        assert!(
            (a - b).abs() <= tolerance * a.abs(),
            "{what} step {step}: {a} vs {b}"
        );
    }
}

/// Compiles `src` with default options, panicking with the diagnostic on failure.
pub fn compiled(src: &str) -> Compiled {
    compiled_with(src, &Options::default())
}

/// Compiles `src` with `options`, panicking with the diagnostic on failure.
pub fn compiled_with(src: &str, options: &Options) -> Compiled {
    match compile(src, options) {
        Ok(c) => c,
        Err(memc::CompileError::User(e)) => {
            panic!("{:?}", miette::Report::new(e.with_source("test.mdl", src)))
        }
        Err(memc::CompileError::Internal(e)) => panic!("internal: {e:?}"),
    }
}

/// The user error compiling `src` with `options` must give; panics when it compiles or
/// fails internally.
pub fn user_error(src: &str, options: &Options) -> memc::diagnostic::UserError {
    match compile(src, options) {
        Err(memc::CompileError::User(e)) => e,
        other => panic!("expected a user error, got {:?}", other.map(|_| ())),
    }
}

/// An executor with parameters and synthetic inputs initialised from `seed`.
pub fn executor(c: &Compiled, seed: u64) -> CpuExecutor {
    let mut ex = CpuExecutor::new(&c.plan).expect("cpu plan");
    ex.init_params(seed).expect("init");
    ex.synthetic_inputs(seed).expect("inputs");
    ex
}

/// Runs one step and returns the loss.
pub fn loss(ex: &mut CpuExecutor) -> f32 {
    ex.run_step(None).expect("step");
    ex.output("loss").expect("loss output")[0]
}

/// `examples/mlp.mdl`, as an absolute path.
pub const MLP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/mlp.mdl");

/// Runs the `memc` binary from the repository root with `args`: no colour, no backtraces,
/// no stdin.
pub fn memc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memc"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("NO_COLOR", "1")
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run memc: {e}"))
}

/// Fails unless `out` exited with status 0, showing its stderr.
#[track_caller]
pub fn assert_success(out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What `memc` with `args` prints on stdout; fails unless it exits with status 0.
#[track_caller]
pub fn stdout_of(args: &[&str]) -> String {
    let out = memc(args);
    assert_success(&out);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `step N loss X` lines of `memc run`'s output `text`.
pub fn step_lines(text: &str) -> Vec<String> {
    (text.lines())
        .filter(|l| l.starts_with("step "))
        .map(str::to_string)
        .collect()
}

/// A fresh, empty directory under the system temp dir, named after the test binary, `name`
/// and the process.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "memc-{}-{name}-{}",
        env!("CARGO_CRATE_NAME"),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// The verifier's messages for a plan it must refuse, checking one contains `needle`.
pub fn refused(plan: memc::plan::Plan, needle: &str) -> Vec<String> {
    let errors: Vec<String> = match memc::plan::verify(plan) {
        Ok(_) => panic!("the tampered plan verifies; expected `{needle}`"),
        Err(e) => e.iter().map(ToString::to_string).collect(),
    };
    assert!(
        errors.iter().any(|e| e.contains(needle)),
        "no error contains `{needle}`: {errors:#?}"
    );
    errors
}

/// Checks LoRA's adapters `w.lora_a` and `w.lora_b` of a model whose only weight `w` is
/// adapted against central finite differences of the step's loss (every `stride`-th
/// element), after giving `w.lora_b` nonzero values (at zero, A's gradient vanishes).
/// Fails naming the adapter whose relative error reaches 1e-2; `label` names the case.
pub fn check_adapter_gradients(ex: &mut CpuExecutor, stride: usize, label: &str) {
    let plan = ex.plan().clone();
    let buffer = |name: &str| plan.params.iter().find(|p| p.name == name).unwrap().buffer;
    let n = plan.buffers[buffer("w.lora_b").index()].ty.numel() as usize;
    let b: Vec<f32> = (0..n).map(|i| 0.3 * ((i as f32) * 0.7).sin()).collect();
    ex.write(buffer("w.lora_b"), &b).unwrap();
    let mut grads = std::collections::HashMap::new();
    ex.run_step(Some(&mut |name: &str, g: &[f32]| {
        grads.insert(name.to_string(), g.to_vec());
    }))
    .unwrap();
    assert_eq!(
        grads.len(),
        2,
        "{label}: only the adapters train: {:?}",
        grads.keys()
    );
    let eps = 1e-2f32;
    for name in ["w.lora_a", "w.lora_b"] {
        let base = ex.read(buffer(name)).to_vec();
        let (mut num, mut den) = (0f64, 0f64);
        for j in (0..base.len()).step_by(stride) {
            let mut at = |delta: f32| {
                let mut p = base.clone();
                p[j] += delta;
                ex.write(buffer(name), &p).unwrap();
                f64::from(loss(ex))
            };
            let fd = (at(eps) - at(-eps)) / (2.0 * f64::from(eps));
            ex.write(buffer(name), &base).unwrap();
            num += (f64::from(grads[name][j]) - fd).powi(2);
            den += fd.powi(2);
        }
        let err = (num / den.max(1e-30)).sqrt();
        assert!(
            den > 0.0 && err < 1e-2,
            "{label} {name}: relative error {err:.2e}"
        );
    }
}

/// Each parameter's relative L2 error `||got - reference|| / ||reference||` (the norm floored
/// at 1e-30), with its name, sorted from the smallest; panics on a parameter `got` lacks.
pub fn relative_errors<'a>(
    reference: &'a std::collections::BTreeMap<String, Vec<f32>>,
    got: &std::collections::BTreeMap<String, Vec<f32>>,
) -> Vec<(f64, &'a str)> {
    let mut errors: Vec<(f64, &str)> = reference
        .iter()
        .map(|(name, r)| {
            let Some(g) = got.get(name) else {
                panic!("no gradient for {name}");
            };
            let diff: f64 = r
                .iter()
                .zip(g)
                .map(|(&a, &b)| f64::from(a - b).powi(2))
                .sum();
            let norm: f64 = r.iter().map(|&a| f64::from(a).powi(2)).sum();
            ((diff / norm.max(1e-30)).sqrt(), name.as_str())
        })
        .collect();
    errors.sort_by(|a, b| a.0.total_cmp(&b.0));
    errors
}
