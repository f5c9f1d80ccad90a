//! A linear layer's bias gradient summed in its weight gradient's GEMM epilogue
//! (`passes::bias_grad_epilogue`, CUDA plans only): the merged op, run by the CPU backend,
//! gives every gradient of the separate sums of the CPU plan (fp32: up to summation order).
//! In bf16, a merged norm gradient also stores its input gradient's bf16 copy for the
//! matmuls below (`passes::norm_backward_merge`): the same values as the CPU plan's casts.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use common::{compiled_with, example, executor, tiny_gpt};
use memc::ir::Op;
use memc::plan::Target;
use memc::settings::Precision;
use memc::Options;
use std::collections::HashMap;

/// The tiny GPT-2 for `target` in `precision`, and every parameter's gradient after one
/// step from seed 7 on the CPU backend.
fn gradients(target: Target, precision: Precision) -> (memc::Compiled, HashMap<String, Vec<f32>>) {
    let options = Options {
        overrides: tiny_gpt(2),
        precision: Some(precision),
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
    let (cuda, merged) = gradients(Target::CUDA_MIN, Precision::Fp32);
    let (cpu, apart) = gradients(Target::Cpu, Precision::Fp32);
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
    assert_close(&merged, &apart, 1e-5);
    assert!(apart.contains_key("layer.0.fc.bias"));
}

/// Every gradient of `got` within `rtol` times the largest of `want`'s, name by name.
fn assert_close(got: &HashMap<String, Vec<f32>>, want: &HashMap<String, Vec<f32>>, rtol: f32) {
    assert_eq!(got.len(), want.len());
    for (name, want) in want {
        let got = &got[name];
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
        // A NaN on either side is an infinite error.
        let err = (got.iter().zip(want)).fold(0f32, |m, (g, w)| match (g - w).abs() {
            d if d.is_nan() => f32::INFINITY,
            d => m.max(d),
        });
        assert!(err <= rtol * scale, "{name}: {err} against {scale}");
    }
}

#[test]
fn bf16_merged_norm_ops_give_the_bits_of_the_separate_ops() {
    let (cuda, merged) = gradients(Target::CUDA_MIN, Precision::Bf16);
    let (_, apart) = gradients(Target::Cpu, Precision::Bf16);
    let steps = &cuda.plan.plan().steps;
    let producer = |b: &memc::plan::BufferId| {
        (steps.iter())
            .find(|s| s.output.as_ref() == Some(b))
            .map(|s| &s.op)
    };
    let narrow_of = |root: fn(&Op) -> bool| {
        (steps.iter())
            .filter(|s| matches!(s.op, Op::Member { dtype: Some(_), .. }))
            .filter(|s| producer(&s.inputs[0]).is_some_and(root))
            .count()
    };
    let count = |what: fn(&Op) -> bool| steps.iter().filter(|s| what(&s.op)).count();
    // Each merged layer norm gradient but the lowest (layer 0's ln1: the embeddings read its
    // gradient in fp32, no matmul) stores its bf16 copy for the matmuls below.
    let norm_backward = |op: &Op| matches!(op, Op::NormBackward { .. });
    assert_eq!((narrow_of(norm_backward), count(norm_backward)), (7, 8));
    // Each attention residual add and the norm of its sum are one op in forward, and in
    // backward's recomputation of them (the MLP's residual sums are saved for backward: not
    // merged). Each norm's bf16 output is a member of the op's fp32 output.
    let add_norm = |op: &Op| matches!(op, Op::AddNorm { .. });
    assert_eq!((narrow_of(add_norm), count(add_norm)), (8, 8));
    // The same bits: each copy is the cast it replaces, each sum and norm computed alike.
    assert_close(&merged, &apart, 0.0);
}
