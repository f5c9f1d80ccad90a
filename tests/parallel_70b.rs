//! A Llama-2-70B-shaped model (80 layers, D = 8192, 64 query heads sharing 8 key/value
//! heads, FFN 28672, V = 32000: 68,976,648,192 parameters) in bf16 with AdamW, one sequence
//! of 2,048 tokens per GPU, planned for the GPU: exact per-rank bytes on 8 GPUs at ZeRO 0-3,
//! and the fewest 80 GiB GPUs for its full fine-tuning.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use common::memc;

/// `memc compile` of the 70B shape on the GPU with `extra` arguments.
fn compile_70b(extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "compile",
        "examples/llama7b.mdl",
        "--precision",
        "bf16",
        "--device",
        "cuda",
    ];
    for set in ["L=80", "D=8192", "H=64", "KV=8", "F=28672", "V=32000"] {
        args.extend(["--set", set]);
    }
    args.extend(extra);
    memc(&args)
}

/// Per-rank bytes on 8 GPUs (every rank the same): params, grads, optimizer, activations,
/// arena and the GPU total with the CUDA context and NCCL reserves. Even ZeRO-3 needs
/// 138,677,276,676 bytes (129.2 GiB) a GPU: its model states alone are 16 bytes a parameter
/// over 8 ranks, 138 GB.
#[test]
fn eight_gpus_at_each_stage() {
    let expected: [(u64, u64, u64, u64, u64); 4] = [
        (
            275_906_592_768,
            275_906_592_768,
            551_813_185_536,
            862_935_162_884,
            864_026_730_500,
        ),
        (
            138_480_222_208,
            138_480_222_208,
            103_333_240_832,
            276_229_439_492,
            277_321_007_108,
        ),
        (
            138_480_222_208,
            17_310_027_776,
            103_333_240_832,
            275_755_483_140,
            276_847_050_756,
        ),
        (
            34_488_324_096,
            34_488_324_096,
            68_976_648_192,
            137_585_709_060,
            138_677_276_676,
        ),
    ];
    for (zero, want) in expected.into_iter().enumerate() {
        let layout = format!("data=8,zero={zero}");
        let out = compile_70b(&["--parallel", &layout, "--format", "json"]);
        common::assert_success(&out);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let r = &v["report"];
        assert_eq!(r["param_count"], 68_976_648_192u64);
        let per_rank = r["parallel"]["per_rank"].as_array().unwrap();
        assert_eq!(per_rank.len(), 8);
        assert!(per_rank.iter().all(|e| e["bytes"] == per_rank[0]["bytes"]));
        let b = &per_rank[0]["bytes"];
        let got = |k: &str| b[k].as_u64().unwrap();
        assert_eq!(got("activations"), 32_950_460_416, "ZeRO-{zero}");
        assert_eq!(
            (
                got("params"),
                got("grads"),
                got("optimizer"),
                got("arena"),
                r["device"]["total"].as_u64().unwrap()
            ),
            want,
            "ZeRO-{zero}"
        );
    }
}

/// With an 80 GiB budget 8 GPUs at ZeRO-3, the most sharded layout, find no plan however
/// much they recompute (fewer GPUs hold more a GPU), and 16 GPUs at ZeRO-3 fit with
/// checkpointing: what `memc fit --ranks` answers (its scan from one GPU is slow for a test).
#[test]
fn sixteen_80gib_gpus_fit_full_finetuning() {
    let eight = compile_70b(&["--parallel", "data=8,zero=3", "--budget", "80GiB"]);
    assert_eq!(eight.status.code(), Some(2));
    let err = String::from_utf8_lossy(&eight.stderr);
    assert!(err.contains("no plan fits"), "{err}");
    assert!(err.contains("111220379652 bytes"), "{err}");
    let sixteen = compile_70b(&[
        "--parallel",
        "data=16,zero=3",
        "--budget",
        "80GiB",
        "--format",
        "json",
    ]);
    common::assert_success(&sixteen);
    let v: serde_json::Value = serde_json::from_slice(&sixteen.stdout).unwrap();
    assert_eq!(v["report"]["device"]["total"], 85_225_125_892u64);
    assert!(v["report"]["device"]["total"].as_u64().unwrap() <= 80 << 30);
}
