//! Hugging Face imports: published configs give the published parameter counts exactly, LoRA
//! finds their `[out, in]` projections, and checkpoints (bf16, sharded, saved from the base
//! model) load into the parameters they name.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use common::{assert_success, compiled_with, memc, scratch};
use half::bf16;
use memc::hf::import_config;
use memc::passes::lora::LoraSpec;
use memc::plan::Report;
use memc::Options;
use safetensors::{tensor::TensorView, Dtype};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// meta-llama/Meta-Llama-3-8B's config.json.
const LLAMA3_8B: &str = r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
  "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256,
  "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
  "hidden_act": "silu", "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "attention_bias": false, "initializer_range": 0.02, "bos_token_id": 128000}"#;

/// mistralai/Mistral-7B-v0.1's config.json.
const MISTRAL_7B: &str = r#"{"architectures": ["MistralForCausalLM"], "model_type": "mistral",
  "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
  "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 32000,
  "max_position_embeddings": 32768, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
  "sliding_window": 4096, "hidden_act": "silu", "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}"#;

/// microsoft/Phi-3-mini-4k-instruct's config.json.
const PHI3_MINI: &str = r#"{"architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
  "hidden_size": 3072, "intermediate_size": 8192, "num_attention_heads": 32,
  "num_key_value_heads": 32, "num_hidden_layers": 32, "vocab_size": 32064,
  "max_position_embeddings": 4096, "original_max_position_embeddings": 4096,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "rope_scaling": null, "sliding_window": 2047,
  "hidden_act": "silu", "pad_token_id": 32000, "tie_word_embeddings": false,
  "embd_pdrop": 0.0, "resid_pdrop": 0.0, "attention_dropout": 0.0, "torch_dtype": "bfloat16"}"#;

/// Qwen/Qwen2-7B's config.json.
const QWEN2_7B: &str = r#"{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
  "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
  "num_key_value_heads": 4, "num_hidden_layers": 28, "vocab_size": 152064,
  "max_position_embeddings": 131072, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 131072, "use_sliding_window": false, "max_window_layers": 28,
  "hidden_act": "silu", "tie_word_embeddings": false, "torch_dtype": "bfloat16"}"#;

/// google/gemma-2b's config.json.
const GEMMA_2B: &str = r#"{"architectures": ["GemmaForCausalLM"], "model_type": "gemma",
  "hidden_size": 2048, "intermediate_size": 16384, "num_attention_heads": 8,
  "num_key_value_heads": 1, "head_dim": 256, "num_hidden_layers": 18, "vocab_size": 256000,
  "max_position_embeddings": 8192, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
  "hidden_act": "gelu", "hidden_activation": null, "torch_dtype": "bfloat16"}"#;

/// google/gemma-2-2b's config.json (the fields memc reads).
const GEMMA2_2B: &str = r#"{"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
  "hidden_size": 2304, "intermediate_size": 9216, "num_attention_heads": 8,
  "num_key_value_heads": 4, "head_dim": 256, "num_hidden_layers": 26, "vocab_size": 256000,
  "max_position_embeddings": 8192, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
  "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
  "query_pre_attn_scalar": 256, "sliding_window": 4096, "attn_logit_softcapping": 50.0,
  "final_logit_softcapping": 30.0, "pad_token_id": 0, "torch_dtype": "float32"}"#;

/// google/gemma-2-9b's config.json (the fields memc reads).
const GEMMA2_9B: &str = r#"{"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
  "hidden_size": 3584, "intermediate_size": 14336, "num_attention_heads": 16,
  "num_key_value_heads": 8, "head_dim": 256, "num_hidden_layers": 42, "vocab_size": 256000,
  "max_position_embeddings": 8192, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
  "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256,
  "sliding_window": 4096, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
  "torch_dtype": "float32"}"#;

/// openai-community/gpt2's config.json.
const GPT2: &str = r#"{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
  "n_embd": 768, "n_head": 12, "n_layer": 12, "n_ctx": 1024, "n_positions": 1024,
  "vocab_size": 50257, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05,
  "initializer_range": 0.02}"#;

/// google-bert/bert-base-uncased's config.json.
const BERT_BASE: &str = r#"{"architectures": ["BertForMaskedLM"], "model_type": "bert",
  "hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12,
  "num_hidden_layers": 12, "vocab_size": 30522, "max_position_embeddings": 512,
  "type_vocab_size": 2, "hidden_act": "gelu", "layer_norm_eps": 1e-12,
  "position_embedding_type": "absolute", "initializer_range": 0.02}"#;

/// google/vit-base-patch16-224's config.json with its 1000 ImageNet labels.
fn vit_b16() -> String {
    let labels: serde_json::Map<String, serde_json::Value> = (0..1000)
        .map(|i| (i.to_string(), format!("class {i}").into()))
        .collect();
    serde_json::json!({
        "architectures": ["ViTForImageClassification"], "model_type": "vit",
        "hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12,
        "num_hidden_layers": 12, "image_size": 224, "patch_size": 16, "num_channels": 3,
        "hidden_act": "gelu", "layer_norm_eps": 1e-12, "qkv_bias": true, "id2label": labels
    })
    .to_string()
}

/// The report of the imported model of `config`, compiled with `options`.
fn report(config: &str, options: &Options) -> Report {
    let written = import_config(config).unwrap_or_else(|e| panic!("{e:?}"));
    compiled_with(&written.mdl, options)
        .plan
        .plan()
        .report
        .clone()
}

/// The imported model of `config`, compiled with `options`: (parameters, trainable ones).
fn counts(config: &str, options: &Options) -> (u64, u64) {
    let r = report(config, options);
    (r.param_count, r.trainable_param_count)
}

#[test]
fn published_configs_give_published_parameter_counts() {
    let cases: [(&str, String, u64); 10] = [
        ("Llama-3-8B", LLAMA3_8B.into(), 8_030_261_248),
        ("Mistral-7B-v0.1", MISTRAL_7B.into(), 7_241_732_096),
        ("Phi-3-mini", PHI3_MINI.into(), 3_821_079_552),
        ("Qwen2-7B", QWEN2_7B.into(), 7_615_616_512),
        ("gemma-2b", GEMMA_2B.into(), 2_506_172_416),
        ("gemma-2-2b", GEMMA2_2B.into(), 2_614_341_888),
        ("gemma-2-9b", GEMMA2_9B.into(), 9_241_705_984),
        ("gpt2", GPT2.into(), 124_439_808),
        (
            "bert-base-uncased (masked LM)",
            BERT_BASE.into(),
            109_514_298,
        ),
        ("vit-base-patch16-224", vit_b16(), 86_567_656),
    ];
    for (name, config, published) in cases {
        let (params, trainable) = counts(&config, &Options::default());
        assert_eq!(params, published, "{name}");
        assert_eq!(trainable, published, "{name}: every parameter trains");
    }
}

#[test]
fn imports_name_their_classes() {
    for (config, class) in [
        (LLAMA3_8B, "LlamaForCausalLM"),
        (MISTRAL_7B, "MistralForCausalLM"),
        (PHI3_MINI, "Phi3ForCausalLM"),
        (QWEN2_7B, "Qwen2ForCausalLM"),
        (GEMMA_2B, "GemmaForCausalLM"),
        (GEMMA2_2B, "Gemma2ForCausalLM"),
        (GPT2, "GPT2LMHeadModel"),
        (BERT_BASE, "BertForMaskedLM"),
    ] {
        assert_eq!(import_config(config).unwrap().class, class);
    }
}

#[test]
fn lora_finds_the_out_in_projections() {
    // r = 16 on q_proj ([4096, 4096]) and v_proj ([1024, 4096]) of 32 layers:
    // 32 x (16 x 4096 + 4096 x 16) + 32 x (16 x 4096 + 1024 x 16).
    let options = Options {
        lora: Some(LoraSpec::parse("r=16,targets=q_proj+v_proj").unwrap()),
        ..Options::default()
    };
    let r = report(LLAMA3_8B, &options);
    assert_eq!(r.trainable_param_count, 6_815_744);
    assert_eq!(r.param_count, 8_030_261_248 + 6_815_744);
    // The config's bf16 is mixed precision: the adapters keep fp32 master weights, the
    // frozen base is stored in bf16 (it never updates), AdamW keeps two fp32 moments.
    assert_eq!(r.bytes.params, 2 * 8_030_261_248 + 4 * 6_815_744);
    assert_eq!(r.bytes.optimizer, 8 * 6_815_744);
}

/// QLoRA's setting: Llama-3-8B with LoRA r = 16 on every linear layer of the blocks over an
/// nf4 base. Each [R, C] projection packs into align4(RC / 2) + align4(RC / 64) +
/// 4 (ceil(RC / 64 / 256) + 1) bytes; embeddings, norms and the output head stay bf16.
#[test]
fn llama3_8b_lora_over_an_nf4_base_fits_24_gib() {
    let options = Options {
        lora: Some(LoraSpec::parse("r=16").unwrap()),
        quantize_frozen: Some(memc::ir::Scheme::Nf4),
        ..Options::default()
    };
    let r = report(LLAMA3_8B, &options);
    let nf4 = |rows: u64, cols: u64| {
        let n = rows * cols;
        let blocks = n.div_ceil(64);
        n.div_ceil(2).div_ceil(4) * 4 + blocks.div_ceil(4) * 4 + 4 * (blocks.div_ceil(256) + 1)
    };
    let (d, kv, ffn, vocab) = (4096, 1024, 14336, 128_256);
    let layer = 2 * nf4(d, d) + 2 * nf4(kv, d) + 3 * nf4(ffn, d);
    assert_eq!(layer, 112_513_052);
    let q = r.quantized.unwrap();
    assert_eq!((q.tensors, q.packed_bytes), (224, 32 * layer));
    let bf16_base = 2 * (2 * vocab * d + 65 * d);
    assert_eq!(r.bytes.params, 32 * layer + bf16_base + 4 * 41_943_040);
    assert_eq!(r.bytes.params, 5_870_068_608);
    assert_eq!(r.trainable_param_count, 41_943_040);
    assert_eq!(r.param_count, 8_030_261_248 + 41_943_040);
    assert!(r.bytes.arena <= 24 << 30, "{}", r.bytes.arena);
}

/// `memc run --params` on an imported model quantizes the loaded weights (the projections,
/// frozen): the step runs, the error is stated once on stderr, and `--save-params` writes the
/// weights dequantized.
#[test]
fn a_checkpoint_loads_into_a_quantized_base() {
    let dir = scratch("quantized");
    let mdl = import_config(TINY_LLAMA).unwrap().mdl;
    let model = dir.join("tiny.mdl");
    std::fs::write(&model, &mdl).unwrap();
    let tensors = tiny_checkpoint(&mdl);
    let file = dir.join("model.safetensors");
    write_bf16(&file, &tensors);
    let saved = dir.join("saved.safetensors");
    let out = memc(&[
        "run",
        model.to_str().unwrap(),
        "--params",
        file.to_str().unwrap(),
        "--freeze",
        "*proj.weight",
        "--quantize-frozen",
        "nf4",
        "--steps",
        "1",
        "--save-params",
        saved.to_str().unwrap(),
    ]);
    assert_success(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("RMS relative error").count(), 1, "{stderr}");
    let bytes = std::fs::read(&saved).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    for (name, shape, want) in &tensors {
        let view = st.tensor(name).unwrap();
        assert_eq!(view.shape(), &shape[..], "{name}");
        let got: Vec<f32> = (view.data().chunks_exact(4))
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let absmax = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let err = got
            .iter()
            .zip(want)
            .fold(0f32, |m, (g, w)| m.max((g - w).abs()));
        // The frozen projections never move: they are their loaded values, dequantized.
        if name.ends_with("proj.weight") {
            assert!(err > 0.0 && err <= 0.16 * absmax, "{name}: {err}");
        }
    }
}

/// A LLaMA small enough to run: 2 layers, D = 32, 4 heads over 2 key/value heads, T = 16.
const TINY_LLAMA: &str = r#"{"model_type": "llama", "hidden_size": 32,
  "intermediate_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2,
  "num_hidden_layers": 2, "vocab_size": 64, "max_position_embeddings": 16,
  "rms_norm_eps": 1e-05, "torch_dtype": "bfloat16"}"#;

/// Writes `tensors` (name, shape, values) as a bf16 safetensors file.
fn write_bf16(path: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)]) {
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, s, v)| {
            let data = v.iter().flat_map(|x| bf16::from_f32(*x).to_le_bytes());
            (n.clone(), s.clone(), data.collect())
        })
        .collect();
    let views: Vec<(String, TensorView)> = bytes
        .iter()
        .map(|(n, s, d)| {
            (
                n.clone(),
                TensorView::new(Dtype::BF16, s.clone(), d).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, &None, path).unwrap();
}

/// Named tensors: name, shape, values.
type Tensors = Vec<(String, Vec<usize>, Vec<f32>)>;

/// Every parameter of the tiny LLaMA as its checkpoint names it, with values exact in bf16.
fn tiny_checkpoint(mdl: &str) -> Tensors {
    let c = compiled_with(mdl, &Options::default());
    let plan = c.plan.plan();
    plan.params
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let shape = plan.buffers[p.buffer.index()].ty.shape.clone();
            let n: usize = shape.iter().product();
            let values = (0..n).map(|j| ((i * 7 + j) % 61) as f32 / 64.0 - 0.4375);
            (p.name.clone(), shape, values.collect())
        })
        .collect()
}

/// A scratch directory `name` holding the tiny LLaMA's `.mdl`, its path, and a checkpoint
/// of it as [`tiny_checkpoint`] makes it.
fn tiny_model(name: &str) -> (PathBuf, PathBuf, Tensors) {
    let dir = scratch(name);
    let mdl = import_config(TINY_LLAMA).unwrap().mdl;
    let model = dir.join("tiny.mdl");
    std::fs::write(&model, &mdl).unwrap();
    let tensors = tiny_checkpoint(&mdl);
    (dir, model, tensors)
}

#[test]
fn a_sharded_bf16_checkpoint_loads_by_name() {
    let (dir, model, tensors) = tiny_model("shards");
    assert!(tensors
        .iter()
        .any(|t| t.0 == "model.layers.1.self_attn.q_proj.weight"));
    // Two shards: the first as saved from LlamaForCausalLM, the second from the base
    // LlamaModel (no `model.` prefix) with a buffer no parameter takes.
    let (first, second) = tensors.split_at(tensors.len() / 2);
    let mut second: Vec<_> = second
        .iter()
        .map(|(n, s, v)| {
            (
                n.strip_prefix("model.").unwrap_or(n).to_string(),
                s.clone(),
                v.clone(),
            )
        })
        .collect();
    second.push((
        "rotary_emb.inv_freq".into(),
        vec![4],
        vec![1.0, 0.5, 0.25, 0.125],
    ));
    write_bf16(&dir.join("model-00001-of-00002.safetensors"), first);
    write_bf16(&dir.join("model-00002-of-00002.safetensors"), &second);
    let mut map = serde_json::Map::new();
    for (n, _, _) in first {
        map.insert(n.clone(), "model-00001-of-00002.safetensors".into());
    }
    for (n, _, _) in &second {
        map.insert(n.clone(), "model-00002-of-00002.safetensors".into());
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();

    let saved = dir.join("saved.safetensors");
    let out = memc(&[
        "run",
        model.to_str().unwrap(),
        "--params",
        dir.to_str().unwrap(),
        "--steps",
        "0",
        "--save-params",
        saved.to_str().unwrap(),
    ]);
    assert_success(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("1 tensor"),
        "unused tensor not reported: {stderr}"
    );
    let bytes = std::fs::read(&saved).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let want: HashMap<&str, &Vec<f32>> = tensors.iter().map(|(n, _, v)| (n.as_str(), v)).collect();
    assert_eq!(st.len(), want.len());
    for (name, view) in st.tensors() {
        let got: Vec<f32> = view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(&&got, want.get(name.as_str()).unwrap(), "{name}");
    }
}

#[test]
fn checkpoint_mismatches_name_the_tensor() {
    let (dir, model, mut tensors) = tiny_model("mismatch");
    let run = |file: &Path| {
        let out = memc(&[
            "run",
            model.to_str().unwrap(),
            "--params",
            file.to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(2));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // A [in, out] weight where the model reads [out, in].
    let gate = tensors
        .iter_mut()
        .find(|t| t.0 == "model.layers.0.mlp.gate_proj.weight")
        .unwrap();
    gate.1.reverse();
    let transposed = dir.join("transposed.safetensors");
    write_bf16(&transposed, &tensors);
    let stderr = run(&transposed);
    assert!(
        stderr.contains("`model.layers.0.mlp.gate_proj.weight` has shape [32, 48]"),
        "{stderr}"
    );
    // A checkpoint without the output head.
    tensors.retain(|t| t.0 != "lm_head.weight" && t.0 != "model.layers.0.mlp.gate_proj.weight");
    let partial = dir.join("partial.safetensors");
    write_bf16(&partial, &tensors);
    let stderr = run(&partial);
    assert!(stderr.contains("2 of 21 parameters missing"), "{stderr}");
}

#[test]
fn sliding_windows_follow_the_config() {
    // Mistral's window applies; Qwen2's only with use_sliding_window; Phi-3's its 2047.
    let mdl = |config: &str| import_config(config).unwrap().mdl;
    let masked = "key_mask = attention_mask)";
    assert!(mdl(MISTRAL_7B).contains(&format!("causal = true, window = 4096, {masked}")));
    assert!(mdl(PHI3_MINI).contains(&format!("causal = true, window = 2047, {masked}")));
    assert!(!mdl(QWEN2_7B).contains("window"));
    assert!(!mdl(LLAMA3_8B).contains("window"));
    // Every decoder reads Hugging Face's attention_mask as its attention's key mask.
    for config in [MISTRAL_7B, PHI3_MINI, QWEN2_7B, LLAMA3_8B] {
        let mdl = mdl(config);
        assert!(mdl.contains("input  attention_mask: i32[B, T]"), "{mdl}");
        assert!(mdl.contains(&format!("causal = true, {masked}")) || mdl.contains("window"));
    }
    // Phi-3 pads with token 32000, whose embedding row gets no gradient.
    assert!(mdl(PHI3_MINI).contains("padding_idx = 32000"));
}

#[test]
fn gemma2_alternates_windowed_and_global_layers_with_soft_caps() {
    let mdl = import_config(GEMMA2_2B).unwrap().mdl;
    // Layer i is local (windowed) when i is even: the cycle starts with `local`.
    assert!(
        mdl.contains("x = repeat L (local, global)(x) as model.layers"),
        "{mdl}"
    );
    let attention = |w: &str| {
        format!("causal = true{w}, scale = 0.0625, softcap = 50, key_mask = attention_mask")
    };
    assert!(mdl.contains(&attention(", window = 4096")), "{mdl}");
    assert!(mdl.contains(&attention("")), "{mdl}");
    assert!(mdl.contains("tanh(logits / 30) * 30"), "{mdl}");
    for norm in ["pre_feedforward_layernorm", "post_feedforward_layernorm"] {
        assert!(mdl.contains(&format!("param {norm}: rmsnorm(D)")), "{mdl}");
    }
    // Null turns a cap and the window off.
    let plain = GEMMA2_2B
        .replace("\"sliding_window\": 4096", "\"sliding_window\": null")
        .replace(
            "\"final_logit_softcapping\": 30.0",
            "\"final_logit_softcapping\": null",
        );
    let mdl = import_config(&plain).unwrap().mdl;
    assert!(
        mdl.contains("x = repeat L layer(x) as model.layers"),
        "{mdl}"
    );
    assert!(!mdl.contains("window") && !mdl.contains("tanh"), "{mdl}");
}

#[test]
fn a_model_folder_imports_from_its_config() {
    let dir = scratch("folder");
    std::fs::write(dir.join("config.json"), TINY_LLAMA).unwrap();
    let out = dir.join("model.mdl");
    let run = memc(&["import", dir.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_success(&run);
    let written = std::fs::read_to_string(&out).unwrap();
    assert_eq!(written, import_config(TINY_LLAMA).unwrap().mdl);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains(&format!("--params {}", dir.display())),
        "{stderr}"
    );
}
