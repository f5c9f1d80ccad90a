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
    common::check_adapter_gradients(&mut ex, 1, "LoRA");
}

/// A model without linear layers in blocks gets a diagnostic, not a step that trains nothing.
#[test]
fn nothing_to_adapt_is_a_user_error() {
    let e = common::user_error(&example("mlp"), &lora("r=4", vec![]));
    assert!(
        e.message.contains("no linear layer inside a block"),
        "{}",
        e.message
    );
    let named = compiled_with(&example("mlp"), &lora("r=4,targets=fc1", vec![]));
    assert_eq!(
        named.plan.plan().report.trainable_param_count,
        4 * (784 + 256)
    );
}

/// `memc run ARGS` from the crate root, returning the last printed loss.
fn last_loss(args: &[String]) -> f64 {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = common::memc(&args);
    common::assert_success(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().rfind(|l| l.starts_with("step ")).unwrap();
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn merged_adapters_give_the_adapted_step_and_peft_names() {
    let dir = common::scratch("merge");
    // A LLaMA with [out, in] weights (read x @ W^T) and GPT-2 with [in, out] ones.
    let llama = dir.join("llama.mdl");
    let config = r#"{"model_type": "llama", "hidden_size": 32, "intermediate_size": 48,
      "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
      "vocab_size": 64, "max_position_embeddings": 16}"#;
    std::fs::write(&llama, memc::hf::import_config(config).unwrap().mdl).unwrap();
    let gpt2 = format!("{}/examples/gpt2.mdl", env!("CARGO_MANIFEST_DIR"));
    let tiny: Vec<String> = common::tiny_gpt(2)
        .iter()
        .flat_map(|(k, v)| ["--set".to_string(), format!("{k}={v}")])
        .collect();
    for (model, lora, extra) in [
        (
            llama.to_str().unwrap(),
            "r=4,alpha=8,targets=q_proj+v_proj",
            vec![],
        ),
        (gpt2.as_str(), "r=2,alpha=6", tiny),
    ] {
        let merged = dir.join("merged.safetensors");
        let adapters = dir.join("adapters");
        let mut args = vec!["run", model, "--precision", "fp32", "--seed", "3"];
        args.extend(extra.iter().map(String::as_str));
        let with = |more: &[&'static str]| -> Vec<String> {
            let flag = ["--lora", lora];
            let all = args.iter().chain(&flag).chain(more);
            all.map(|s| s.to_string()).collect()
        };
        // The fourth adapted step, and the base model's first step from the merged weights
        // after three adapted steps, see the same weights.
        let fourth = last_loss(&with(&["--steps", "4"]));
        let (m, a) = (merged.to_str().unwrap(), adapters.to_str().unwrap());
        let mut saving = with(&["--steps", "3", "--merge-adapters"]);
        saving.extend(["--save-params", m, "--save-adapters", a].map(String::from));
        last_loss(&saving);
        let base: Vec<String> = args
            .iter()
            .chain(&["--params", m])
            .map(|s| s.to_string())
            .collect();
        let base = last_loss(&base);
        assert!(
            (fourth - base).abs() <= 1e-6 * fourth.abs(),
            "{model}: {fourth} vs {base}"
        );
        // PEFT's names and shapes: lora_A [r, in], lora_B [out, r].
        let bytes = std::fs::read(adapters.join("adapter_model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let config = std::fs::read_to_string(adapters.join("adapter_config.json")).unwrap();
        let config: serde_json::Value = serde_json::from_str(&config).unwrap();
        let r = config["r"].as_u64().unwrap() as usize;
        for (name, view) in st.tensors() {
            assert!(name.starts_with("base_model.model."), "{name}");
            let shape = view.shape();
            if name.ends_with(".lora_A.weight") {
                assert_eq!(shape[0], r, "{name}");
            } else {
                assert!(name.ends_with(".lora_B.weight"), "{name}");
                assert_eq!(shape[1], r, "{name}");
            }
        }
        if model.ends_with("llama.mdl") {
            let q = "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight";
            assert_eq!(st.tensor(q).unwrap().shape(), [4, 32]);
            assert_eq!(st.len(), 2 * 2 * 2);
            assert_eq!(
                config["target_modules"],
                serde_json::json!(["q_proj", "v_proj"])
            );
        }
    }
}

#[test]
fn saving_adapters_without_lora_is_refused_before_any_step() {
    let out = common::memc(&["run", common::MLP, "--save-adapters", "never-written"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("this plan has no adapters"), "{stderr}");
    assert!(out.stdout.is_empty(), "a step ran first");
    assert!(!std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("never-written")
        .exists());
}

#[test]
fn lora_and_quantization_in_the_train_section_equal_the_flags() {
    let config = r#"{"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
      "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
      "vocab_size": 64, "max_position_embeddings": 16}"#;
    let mdl = memc::hf::import_config(config).unwrap().mdl;
    let in_section = mdl.replace(
        "    precision = fp32\n",
        "    precision = fp32\n    lora = lora(r = 4, alpha = 8, targets = (q_proj, v_proj))\n    quantize_frozen = nf4\n",
    );
    assert_ne!(in_section, mdl, "the import's train section changed shape");
    let by_flags = Options {
        lora: Some(LoraSpec::parse("r=4,alpha=8,targets=q_proj+v_proj").unwrap()),
        quantize_frozen: Some(memc::ir::Scheme::Nf4),
        ..Options::default()
    };
    let a = compiled_with(&in_section, &Options::default());
    let b = compiled_with(&mdl, &by_flags);
    let (ra, rb) = (&a.plan.plan().report, &b.plan.plan().report);
    // 2 layers x (q: 64x4 + 4x64, v: 64x4 + 4x32).
    assert_eq!(ra.trainable_param_count, 2 * (512 + 384));
    assert_eq!(ra.trainable_param_count, rb.trainable_param_count);
    assert_eq!(ra.bytes, rb.bytes);
    assert_eq!(a.plan.plan().train, b.plan.plan().train);
    // The command line wins over the section.
    let rank8 = Options {
        lora: Some(LoraSpec::parse("r=8,targets=q_proj").unwrap()),
        ..Options::default()
    };
    let c = compiled_with(&in_section, &rank8);
    assert_eq!(
        c.plan.plan().report.trainable_param_count,
        2 * (64 * 8 + 8 * 64)
    );
}
