//! LoRA (`--lora`): exact trainable counts, a first step identical to the base model's, the
//! base never moving while the adapters train, and the adapters' gradients against finite
//! differences.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use common::{compiled_with, example, executor, loss};
use memc::passes::lora::LoraSpec;
use memc::Options;

fn lora(spec: &str, overrides: Vec<(String, i64)>) -> Options {
    Options {
        lora: Some(LoraSpec::parse(spec).unwrap()),
        overrides,
        ..Options::default()
    }
}

#[test]
fn trainable_counts_are_exact() {
    // LLaMA-7B, r = 16 on wq and wv: 32 layers x 2 weights x (4096 x 16 + 16 x 4096).
    let llama = compiled_with(&example("llama7b"), &lora("r=16,targets=wq+wv", vec![]));
    let r = &llama.plan.plan().report;
    assert_eq!(r.trainable_param_count, 8_388_608);
    assert_eq!(r.param_count, 6_738_415_616 + 8_388_608);
    // GPT-2 small, r = 8 on every linear layer of the blocks (qkv, proj, fc, fc_proj).
    let gpt2 = compiled_with(&example("gpt2"), &lora("r=8", vec![]));
    assert_eq!(gpt2.plan.plan().report.trainable_param_count, 1_179_648);
    // AdamW state and gradients exist for the adapters only (fp32: 4 + 8 bytes each).
    let b = &gpt2.plan.plan().report.bytes;
    assert_eq!((b.grads, b.optimizer), (4 * 1_179_648, 8 * 1_179_648));
}

#[test]
fn the_first_step_is_the_base_models_and_only_adapters_move() {
    let dims = common::tiny_gpt(2);
    let base = compiled_with(
        &example("gpt2"),
        &Options {
            overrides: dims.clone(),
            ..Options::default()
        },
    );
    let adapted = compiled_with(&example("gpt2"), &lora("r=4", dims));
    // The adapted step starts from the base step's weights (initial values are drawn per
    // plan), so its first loss is the base model's, bit for bit.
    let mut reference = executor(&base, 9);
    let mut ex = executor(&adapted, 9);
    let plan = ex.plan().clone();
    for p in &reference.plan().params.clone() {
        let to = plan
            .params
            .iter()
            .find(|q| q.name == p.name)
            .unwrap()
            .buffer;
        ex.write(to, &reference.read(p.buffer)).unwrap();
    }
    let snapshot = |ex: &memc::exec::cpu::CpuExecutor, adapters: bool| -> Vec<Vec<f32>> {
        plan.params
            .iter()
            .filter(|p| p.name.contains(".lora_") == adapters)
            .map(|p| ex.read(p.buffer).to_vec())
            .collect()
    };
    let (base_before, adapters_before) = (snapshot(&ex, false), snapshot(&ex, true));
    let losses: Vec<f32> = (0..4).map(|_| loss(&mut ex)).collect();
    assert_eq!(loss(&mut reference).to_bits(), losses[0].to_bits());
    assert_eq!(snapshot(&ex, false), base_before, "a base parameter moved");
    assert_ne!(snapshot(&ex, true), adapters_before);
    assert!(losses[3] < losses[0], "{losses:?}");
}

#[test]
fn adapter_gradients_match_finite_differences() {
    let src = "model t {\n  dim B = 3, D = 6\n  input x: [B, D]\n  param w: [D, D] = normal(0.5)\n  let h = tanh(x @ w)\n  loss = mean(h * h)\n  train { optimizer = sgd(lr = 0.0) }\n}\n";
    let c = compiled_with(src, &lora("r=2,alpha=4,targets=w", vec![]));
    let mut ex = executor(&c, 4);
    let plan = ex.plan().clone();
    let buffer = |name: &str| plan.params.iter().find(|p| p.name == name).unwrap().buffer;
    // B starts at zero, where A's gradient vanishes: give B values first.
    let b: Vec<f32> = (0..12).map(|i| 0.3 * ((i as f32) * 0.7).sin()).collect();
    ex.write(buffer("w.lora_b"), &b).unwrap();
    let mut grads = std::collections::HashMap::new();
    ex.run_step(Some(&mut |name: &str, g: &[f32]| {
        grads.insert(name.to_string(), g.to_vec());
    }))
    .unwrap();
    assert_eq!(
        grads.len(),
        2,
        "only the adapters train: {:?}",
        grads.keys()
    );
    let eps = 1e-2f32;
    for name in ["w.lora_a", "w.lora_b"] {
        let base = ex.read(buffer(name)).to_vec();
        let (mut num, mut den) = (0f64, 0f64);
        for j in 0..base.len() {
            let mut at = |delta: f32| {
                let mut p = base.clone();
                p[j] += delta;
                ex.write(buffer(name), &p).unwrap();
                f64::from(loss(&mut ex))
            };
            let fd = (at(eps) - at(-eps)) / (2.0 * f64::from(eps));
            ex.write(buffer(name), &base).unwrap();
            num += (f64::from(grads[name][j]) - fd).powi(2);
            den += fd.powi(2);
        }
        let err = (num / den.max(1e-30)).sqrt();
        assert!(den > 0.0 && err < 1e-2, "{name}: relative error {err:.2e}");
    }
}

/// A model without linear layers in blocks gets a diagnostic, not a step that trains nothing.
#[test]
fn nothing_to_adapt_is_a_user_error() {
    match memc::compile(&example("mlp"), &lora("r=4", vec![])) {
        Err(memc::CompileError::User(e)) => {
            assert!(
                e.message.contains("no linear layer inside a block"),
                "{}",
                e.message
            )
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    let named = compiled_with(&example("mlp"), &lora("r=4,targets=fc1", vec![]));
    assert_eq!(
        named.plan.plan().report.trainable_param_count,
        4 * (784 + 256)
    );
}
