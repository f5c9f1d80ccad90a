//! `--quantize-frozen`: a LoRA model over a quantized base trains on the CPU while the base
//! never moves, the adapters' gradients match finite differences through the dequantized
//! weights, backward saves no dequantized weight, and bad requests get diagnostics.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use common::{compiled_with, example, executor, loss, tiny_gpt};
use memc::ir::Scheme;
use memc::passes::lora::LoraSpec;
use memc::settings::Precision;
use memc::Options;

fn options(lora: &str, scheme: Option<Scheme>, overrides: Vec<(String, i64)>) -> Options {
    Options {
        lora: Some(LoraSpec::parse(lora).unwrap()),
        quantize_frozen: scheme,
        overrides,
        ..Options::default()
    }
}

#[test]
fn a_lora_model_trains_over_a_quantized_base_that_never_moves() {
    for (scheme, precision) in [
        (Scheme::Nf4, Precision::Bf16),
        (Scheme::Int8, Precision::Fp32),
    ] {
        let c = compiled_with(
            &example("gpt2"),
            &Options {
                precision: Some(precision),
                ..options("r=4", Some(scheme), tiny_gpt(2))
            },
        );
        let plan = c.plan.plan().clone();
        let q = plan.report.quantized.unwrap();
        // Four linear weights per block, [32, 96], [32, 32], [32, 128], [128, 32].
        assert_eq!((q.scheme, q.tensors, q.weights), (scheme, 16, 4 * 12_288));
        let quantized: Vec<_> = plan.params.iter().filter(|p| p.quant.is_some()).collect();
        assert_eq!(quantized.len(), 16);
        let packed: u64 = quantized
            .iter()
            .map(|p| p.quant.unwrap().packed_bytes())
            .sum();
        assert_eq!(packed, q.packed_bytes);
        let mut ex = executor(&c, 5);
        let errors = ex.quantization().unwrap();
        assert_eq!(errors.weights, q.weights);
        assert!(errors.rms_relative() > 0.0 && errors.rms_relative() < 0.12);
        let base = |ex: &memc::exec::cpu::CpuExecutor| -> Vec<Vec<u32>> {
            let read = |p: &&memc::plan::ParamBinding| {
                ex.read(p.buffer).iter().map(|v| v.to_bits()).collect()
            };
            quantized.iter().map(read).collect()
        };
        let before = base(&ex);
        let losses: Vec<f32> = (0..5).map(|_| loss(&mut ex)).collect();
        assert_eq!(base(&ex), before, "{scheme}: the quantized base moved");
        assert!(losses[4] < losses[0], "{scheme}: {losses:?}");
    }
}

#[test]
fn adapter_gradients_through_a_quantized_base_match_finite_differences() {
    let src = "model t {\n  dim B = 3, D = 64\n  input x: [B, D]\n  param w: [D, D] = normal(0.5)\n  let h = tanh(x @ w)\n  loss = mean(h * h)\n  train { optimizer = sgd(lr = 0.0) }\n}\n";
    for scheme in Scheme::ALL {
        let c = compiled_with(src, &options("r=2,alpha=4,targets=w", Some(scheme), vec![]));
        let mut ex = executor(&c, 4);
        common::check_adapter_gradients(&mut ex, 7, &format!("{scheme}"));
    }
}

/// Backward reads the dequantized weights again from the packed bytes: what forward saves
/// for backward is, byte for byte, what it saves over an unquantized base.
#[test]
fn backward_saves_no_dequantized_weight() {
    for precision in [Precision::Fp32, Precision::Bf16] {
        let compile = |scheme| {
            let o = Options {
                precision: Some(precision),
                checkpoint: memc::budget::CheckpointMode::KeepAll,
                ..options("r=4", scheme, tiny_gpt(2))
            };
            compiled_with(&example("gpt2"), &o)
                .plan
                .plan()
                .report
                .clone()
        };
        let (plain, nf4) = (compile(None), compile(Some(Scheme::Nf4)));
        assert_eq!(
            nf4.bytes.activations, plain.bytes.activations,
            "{precision:?}"
        );
        assert_eq!(nf4.saved, plain.saved, "{precision:?}");
        assert!(nf4.saved.iter().all(|s| s.op != "dequantize"));
        let q = nf4.quantized.unwrap();
        assert_eq!(
            plain.bytes.params - nf4.bytes.params,
            q.unpacked_bytes - q.packed_bytes
        );
    }
}

#[test]
fn nothing_frozen_to_quantize_is_a_user_error() {
    let o = Options {
        quantize_frozen: Some(Scheme::Int8),
        ..Options::default()
    };
    let e = common::user_error(&example("mlp"), &o);
    assert!(
        e.message.contains("finds no weight to quantize"),
        "{}",
        e.message
    );
    assert_eq!(Scheme::parse("nf4"), Some(Scheme::Nf4));
    assert_eq!(Scheme::parse("int4"), None);
}
