//! Builds a representative kernel set (every family; f32, f16, bf16; all casts) and every
//! example plan's kernels with NVRTC to CUBINs: GPT-2, Llama-7B, ResNet-18 and the UNet at
//! their real sizes in fp32 and bf16 for sm_80 and sm_90, none spilling; the op cases and
//! the plans at reduced sizes for sm_80.
//! Without NVRTC the test prints a SKIP line, unless MEMC_REQUIRE_NVRTC=1 makes it fail.
#![allow(
    clippy::panic,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used
)]

mod cuda_cases;

use cuda_cases::quant::{quant_cases, QuantCase};
use cuda_cases::*;
use memc::codegen::nvrtc::{check_all, nvrtc_available, TARGET_SMS};
use memc::codegen::{cast_kernel, Kernel};
use memc::front::train::Precision;
use memc::ir::DType;
use std::collections::{BTreeMap, BTreeSet};

fn all_kernels() -> BTreeMap<String, (String, Kernel)> {
    let mut ks = BTreeMap::new();
    for KernelCase { label, kernel, .. } in kernel_cases()
        .into_iter()
        .chain(kernel_cases_of(select::select_cases()))
        .chain(updates::bitwise_kernel_cases())
    {
        ks.insert(kernel.name.clone(), (label, kernel));
    }
    for QuantCase { label, kernel, .. } in quant_cases() {
        ks.insert(kernel.name.clone(), (label, kernel));
    }
    let floats = [DType::F32, DType::F16, DType::BF16];
    for from in floats {
        for to in floats {
            if from != to {
                let k = cast_kernel(from, to, 1000);
                ks.insert(k.name.clone(), (format!("cast/{from}->{to}"), k));
            }
        }
    }
    ks
}

/// Whether the NVRTC checks can run; without NVRTC prints SKIP, or fails under MEMC_REQUIRE_NVRTC=1.
fn nvrtc_ready() -> bool {
    if nvrtc_available() {
        return true;
    }
    if std::env::var("MEMC_REQUIRE_NVRTC").as_deref() == Ok("1") {
        panic!("NVRTC not found but MEMC_REQUIRE_NVRTC=1 (source scripts/cuda-env)");
    }
    println!("SKIP: NVRTC not found (set up with scripts/cuda-env)");
    false
}

/// Builds every kernel with code (a step of library calls alone has none) to CUBINs for
/// `sms` and asserts each builds and that none `must_not_spill` names spills (the others'
/// spills are printed).
fn check(
    kernels: &[(String, Kernel)],
    (what, sms): (&str, &[(u32, u32)]),
    must_not_spill: &BTreeSet<String>,
) {
    let kernels: Vec<(String, Kernel)> =
        kernels.iter().filter(|k| k.1.has_code()).cloned().collect();
    let found = check_all(&kernels, sms);
    println!(
        "{what}: {} of {} distinct kernels built to CUBINs for {sms:?}",
        found.built,
        kernels.len()
    );
    for s in &found.spills {
        println!(
            "{what}: {} ({}) spills {} bytes on {}",
            s.label, s.kernel, s.bytes, s.arch
        );
    }
    assert!(
        found.failures.is_empty(),
        "{} failures:\n{}",
        found.failures.len(),
        found.failures.join("\n\n")
    );
    assert_eq!(found.built, kernels.len());
    let forbidden: Vec<_> = (found.spills.iter())
        .filter(|s| must_not_spill.contains(&s.kernel))
        .collect();
    assert!(forbidden.is_empty(), "{forbidden:#?}");
}

/// The oldest architecture the kernels target: what builds for it builds for sm_90, which
/// only adds instructions. Kernels whose spills are not asserted are built for it alone.
const OLDEST: &[(u32, u32)] = &[(8, 0)];

#[test]
fn op_case_kernels_build_to_cubins() {
    if nvrtc_ready() {
        let kernels = all_kernels().into_values().collect::<Vec<_>>();
        check(&kernels, ("op cases", OLDEST), &BTreeSet::new());
    }
}

/// The examples built at their real sizes in fp32 and bf16.
const REAL_SIZE: [&str; 4] = ["gpt2", "llama7b", "resnet18", "unet"];

/// Every kernel of every example's plan in every precision (fp32, bf16, fp16, pure bf16), and
/// of the Llama example with a sliding window, with soft-capped scores and with a key mask
/// (padding): GPT-2, Llama-7B, ResNet-18 and the UNet as written (their real sizes) in fp32
/// and bf16, every other plan at reduced sizes (the same templates, fewer constants).
#[test]
fn every_example_plan_kernel_compiles() {
    if !nvrtc_ready() {
        return;
    }
    let small: &[(&str, i64)] = &[
        ("B", 2),
        ("T", 16),
        ("L", 2),
        ("D", 64),
        ("H", 4),
        ("V", 128),
    ];
    let mut sources = Vec::new();
    for entry in
        std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/examples")).expect("examples")
    {
        let path = entry.expect("entry").path();
        let src = std::fs::read_to_string(&path).expect("read");
        if src.contains("model llama7b") {
            // Mistral's shape: Llama with a sliding window shorter than T.
            let windowed = src.replace("causal = true)", "causal = true, window = 5)");
            assert_ne!(windowed, src, "llama7b's attention line changed");
            sources.push((format!("{} window = 5", path.display()), windowed, false));
            // Gemma 2's soft-capped scores, with a window.
            let capped = src.replace(
                "causal = true)",
                "causal = true, window = 5, softcap = 50.0)",
            );
            sources.push((format!("{} softcap = 50", path.display()), capped, false));
            // A padded batch: Hugging Face's attention_mask as the key mask.
            let masked = src
                .replace(
                    "input  targets: i32[B, T]",
                    "input  targets: i32[B, T]\n  input  attention_mask: i32[B, T]",
                )
                .replace(
                    "causal = true)",
                    "causal = true, key_mask = attention_mask)",
                );
            assert_eq!(
                masked.matches("attention_mask").count(),
                2,
                "llama7b changed"
            );
            sources.push((format!("{} key_mask", path.display()), masked, false));
        }
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        let real = REAL_SIZE.contains(&stem);
        sources.push((path.display().to_string(), src, real));
    }
    let mut kernels = BTreeMap::new();
    let mut as_written_kernels = BTreeSet::new();
    for (name, src, real) in sources {
        let ast = memc::front::parse(&src).expect("parse");
        let dims = memc::front::lower(&ast, &[]).expect("lower").dims;
        // The SD UNet's kernels at a 16x16 latent and 64 channels, the 3-D UNet's on a 16^3
        // volume: the same kernels, fewer shapes to compile.
        let sd: &[(&str, i64)] = if src.contains("model sd_unet") {
            &[("S", 16), ("M", 64)]
        } else if src.contains("model unet3d") {
            &[("S", 16)]
        } else {
            &[]
        };
        let overrides: Vec<(String, i64)> = small
            .iter()
            .chain(sd)
            .filter(|(k, _)| dims.iter().any(|(d, _)| d == k))
            .map(|&(k, v)| (k.to_string(), v))
            .collect();
        let precisions = [
            (Precision::Fp32, true),
            (Precision::Bf16, true),
            (Precision::Fp16, true),
            (Precision::Bf16, false),
        ];
        for (precision, master_weights) in precisions {
            let as_written = real && master_weights && precision != Precision::Fp16;
            let options = memc::Options {
                overrides: if as_written {
                    Vec::new()
                } else {
                    overrides.clone()
                },
                precision: Some(precision),
                master_weights: Some(master_weights),
                ..Default::default()
            };
            let compiled = memc::compile(&src, &options).expect("compile");
            for k in memc::codegen::plan_kernels(compiled.plan.plan()).expect("codegen") {
                let label = match as_written {
                    true => format!("{name} {precision:?} as written"),
                    false => format!("{name} {precision:?}"),
                };
                if as_written {
                    as_written_kernels.insert(k.name.clone());
                }
                kernels.insert(k.name.clone(), (label, k));
            }
        }
    }
    assert!(
        kernels
            .values()
            .any(|(_, k)| k.source.contains("WINDOW = 5ull")),
        "the windowed plan's attention kernels are among them"
    );
    assert!(
        kernels
            .values()
            .any(|(_, k)| k.source.contains("SOFTCAP = 5") && k.source.contains("SLOPES = true")),
        "the soft-capped plan's attention kernels are among them"
    );
    assert!(
        kernels
            .values()
            .any(|(_, k)| k.source.contains("KEY_MASK = true")),
        "the masked plan's attention kernels are among them"
    );
    assert!(
        as_written_kernels.len() > 400,
        "{}",
        as_written_kernels.len()
    );
    let (real, reduced): (Vec<_>, Vec<_>) =
        (kernels.into_values()).partition(|(_, k)| as_written_kernels.contains(&k.name));
    check(&real, ("real sizes", &TARGET_SMS), &as_written_kernels);
    check(&reduced, ("reduced sizes", OLDEST), &BTreeSet::new());
}

/// Kernels are compiled in batches; a broken kernel fails alone and is named.
#[test]
fn a_broken_kernel_in_a_batch_is_named() {
    if !nvrtc_ready() {
        return;
    }
    let good: Vec<(String, Kernel)> = [10, 20]
        .iter()
        .map(|&n| (format!("cast {n}"), cast_kernel(DType::F32, DType::BF16, n)))
        .collect();
    let mut broken = cast_kernel(DType::F32, DType::BF16, 30);
    broken.source = broken.source.replace("cast_kernel<", "no_such_template<");
    broken.name = "broken_cast".into();
    let mut all = good;
    all.push(("broken".into(), broken));
    let found = check_all(&all, OLDEST);
    let failures = &found.failures;
    assert_eq!(found.built, 2, "{failures:?}");
    assert!(
        !failures.is_empty() && failures.iter().all(|f| f.contains("broken_cast")),
        "{failures:?}"
    );
}

/// A CUBIN for each real architecture is an ELF image, and ptxas's report gives its
/// registers (each thread of a cast uses some) and no spills.
#[test]
fn cubins_carry_ptxas_figures() {
    if !nvrtc_ready() {
        return;
    }
    let kernel = cast_kernel(DType::F32, DType::BF16, 4096);
    for sm in [(8, 0), (9, 0)] {
        let cubin = memc::codegen::nvrtc::compile_cubin(&kernel, sm).expect("cubin");
        assert_eq!(&cubin.image[..4], b"\x7fELF", "sm_{}{}", sm.0, sm.1);
        let r = cubin.resources;
        assert!(r.registers > 0 && r.registers <= 255, "{r:?}");
        assert_eq!((r.spill_store_bytes, r.spill_load_bytes), (0, 0), "{r:?}");
    }
}

/// Attention's forward and its three backward ops on 16-bit operands at GPT-2 small's (12
/// heads of 64, T = 1024) and Llama-7B's (32 heads of 128, T = 4096) real sizes are the
/// tensor-core kernels: their PTX issues `mma.sync`, the backward makes no library call, and
/// their CUBINs for sm_80 and sm_90 spill nothing. Head dims that are not a multiple of 16
/// keep the SIMT forward and the cuBLASLt backward.
#[test]
fn attention_runs_on_tensor_cores_without_spills() {
    if !nvrtc_ready() {
        return;
    }
    use memc::codegen::gemm::Call;
    use memc::ir::{AttnInput, AttnParams, Op, TensorType};
    let attn = |heads| AttnParams {
        heads,
        kv_heads: heads,
        causal: true,
        scale: 0.125,
        window: None,
        softcap: None,
        key_mask: false,
    };
    for (dtype, heads, width, t) in [
        (DType::BF16, 12, 768, 1024),
        (DType::F16, 12, 768, 1024),
        (DType::BF16, 32, 4096, 4096),
        (DType::F16, 32, 4096, 4096),
        (DType::BF16, 4, 4 * 24, 64),
    ] {
        let x = TensorType::new(dtype, vec![1, t, width]);
        let mma = (width / heads).is_multiple_of(16);
        let forward = Op::Attention(attn(heads));
        let backward =
            [AttnInput::Q, AttnInput::K, AttnInput::V].map(|which| Op::AttentionBackward {
                attn: attn(heads),
                which,
            });
        for op in std::iter::once(&forward).chain(&backward) {
            let arity = if matches!(op, Op::Attention(_)) { 3 } else { 4 };
            let inputs = vec![x.clone(); arity];
            let kernel = memc::codegen::kernel_for(op, &inputs, &x)
                .expect("lowered")
                .expect("a kernel");
            let which = match op {
                Op::AttentionBackward { which, .. } => format!("backward {which:?}"),
                _ => "forward".to_string(),
            };
            let label = format!(
                "attention {which} {dtype} heads {heads} x {}",
                width / heads
            );
            assert_eq!(kernel.source.contains("_mma_kernel<"), mma, "{label}");
            if matches!(op, Op::AttentionBackward { .. }) {
                let gemms = kernel.library.iter().filter(|c| matches!(c, Call::Gemm(_)));
                assert_eq!(gemms.count() == 0, mma, "{label}");
            }
            assert_no_spills(&kernel, &label);
            if mma {
                let ptx = memc::codegen::nvrtc::compile_ptx(&kernel, "compute_80").expect("ptx");
                assert!(ptx.contains("mma.sync.aligned.m16n8k16"), "{label}");
            }
        }
    }
}

/// Packed attention at GPT-2's size (12 heads of 64 over 1,024 rows) and with heads of 128
/// (grouped-query, 32 heads over 8 kv heads), in bf16 and f16: the forward and the one
/// backward run on tensor cores (the backward in two launches with dk and dv together up to
/// heads of 64, three beyond; no GEMM) and their CUBINs for sm_80 and sm_90 spill nothing.
#[test]
fn packed_attention_runs_on_tensor_cores_without_spills() {
    if !nvrtc_ready() {
        return;
    }
    use memc::codegen::gemm::Call;
    use memc::ir::{AttnParams, Op, TensorType};
    for (dtype, heads, kv_heads, dh, t) in [
        (DType::BF16, 12, 12, 64, 1024),
        (DType::F16, 12, 12, 64, 1024),
        (DType::BF16, 32, 8, 128, 4096),
        (DType::F16, 32, 8, 128, 4096),
    ] {
        let attn = AttnParams {
            heads,
            kv_heads,
            causal: true,
            scale: 0.125,
            window: None,
            softcap: None,
            key_mask: false,
        };
        let x = TensorType::new(dtype, vec![1, t, (heads + 2 * kv_heads) * dh]);
        let out = TensorType::new(dtype, vec![1, t, heads * dh]);
        let cases = [
            (Op::PackedAttention(attn), vec![x.clone()], out.clone()),
            (Op::PackedAttentionBackward(attn), vec![x.clone(), out], x),
        ];
        for (op, inputs, output) in cases {
            let label = format!("{} {dtype} {heads}/{kv_heads} heads x {dh}", op.name());
            let kernel = memc::codegen::kernel_for(&op, &inputs, &output)
                .expect("lowered")
                .expect("a kernel");
            assert!(kernel.source.contains("_mma_kernel<"), "{label}");
            if matches!(op, Op::PackedAttentionBackward(_)) {
                let launches = kernel
                    .library
                    .iter()
                    .filter(|c| matches!(c, Call::Launch { .. }));
                assert_eq!(launches.count(), if dh <= 64 { 2 } else { 3 }, "{label}");
                let gemms = kernel.library.iter().filter(|c| matches!(c, Call::Gemm(_)));
                assert_eq!(gemms.count(), 0, "{label}");
            }
            assert_no_spills(&kernel, &label);
        }
    }
}

/// Compiles `kernel` to CUBIN for sm_80 and sm_90 and asserts ptxas spilled nothing,
/// printing its figures.
fn assert_no_spills(kernel: &Kernel, label: &str) {
    for sm in [(8, 0), (9, 0)] {
        let cubin = memc::codegen::nvrtc::compile_cubin(kernel, sm).expect("cubin");
        let r = cubin.resources;
        assert_eq!(
            (r.spill_store_bytes, r.spill_load_bytes),
            (0, 0),
            "{label}: {r:?}"
        );
        println!("{label}: sm_{}{} {r:?}", sm.0, sm.1);
    }
}
