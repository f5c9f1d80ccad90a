//! A linear layer's bias gradient summed in its weight gradient's GEMM epilogue
//! (`passes::bias_grad_epilogue`, CUDA plans only): the merged op, run by the CPU backend,
//! gives every gradient of the separate sums of the CPU plan (fp32: up to summation order).
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use common::{compiled_with, example, executor, tiny_gpt};
use memc::ir::Op;
use memc::plan::Target;
use memc::settings::Precision;
use memc::Options;
use std::collections::HashMap;

/// The tiny GPT-2 for `target` in fp32, and every parameter's gradient after one step from
/// seed 7 on the CPU backend.
fn gradients(target: Target) -> (memc::Compiled, HashMap<String, Vec<f32>>) {
    let options = Options {
        overrides: tiny_gpt(2),
        precision: Some(Precision::Fp32),
        target,
        ..Options::default()
    };
    let c = compiled_with(&example("gpt2"), &options);
    let mut ex = executor(&c, 7);
    let mut grads = HashMap::new();
    ex.run_step(Some(&mut |name: &str, g: &[f32]| {
        grads.insert(name.to_string(), g.to_vec());
    }))
    .expect("step");
    (c, grads)
}

#[test]
fn merged_bias_gradients_match_the_separate_sums() {
    let (cuda, merged) = gradients(Target::CUDA_MIN);
    let (cpu, apart) = gradients(Target::Cpu);
    let count = |c: &memc::Compiled| {
        let steps = &c.plan.plan().steps;
        steps
            .iter()
            .filter(|s| matches!(s.op, Op::MatMulBiasGrad { .. }))
            .count()
    };
    // Four layers: the qkv and fc biases' gradients merge on CUDA, and the top layer's
    // fc_proj bias, which the final norm's gradient does not sum (held together with it,
    // the fp32 step's peak would rise); none on the CPU.
    assert_eq!((count(&cuda), count(&cpu)), (9, 0));
    assert_eq!(merged.len(), apart.len());
    for (name, want) in &apart {
        let got = &merged[name];
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
        let err = got
            .iter()
            .zip(want)
            .fold(0f32, |m, (g, w)| m.max((g - w).abs()));
        assert!(err <= 1e-5 * scale, "{name}: {err} against {scale}");
    }
    assert!(apart.contains_key("layer.0.fc.bias"));
}
