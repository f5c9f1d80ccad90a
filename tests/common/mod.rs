//! Helpers shared by integration tests: compile a source, run steps on the CPU.
#![allow(dead_code, clippy::panic)]

use memc::exec::cpu::CpuExecutor;
use memc::{compile, Compiled, Options};

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

/// `--set` style overrides from `(name, value)` pairs.
pub fn overrides(dims: &[(&str, i64)]) -> Vec<(String, i64)> {
    dims.iter().map(|&(k, v)| (k.to_string(), v)).collect()
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
