//! Runs the generated CUDA kernels on the CPU through the g++ host shim
//! (`kernels/sim/cuda_sim.h`) and compares them with the CPU backend: every op case of
//! `tests/cuda_cases` in f32, f16 and bf16, the casts, and whole training steps of tiny
//! GPT-2, Llama and MLP plans launched kernel by kernel over one arena in plan order
//! (`tests/shim_steps`; the 3-D UNet's in `tests/shim_volume.rs`).
//! Without g++ the tests print SKIP.
//!
//! Each op case also runs with blocks and threads in reverse order and must give bit-identical
//! results (a race between threads or blocks would not).
//!
//! Tolerances: an element passes when |shim - cpu| <= rtol * (|cpu| + 0.1 * max|cpu|), with
//! rtol = 1e-4 for f32 outputs and two units of the format's epsilon for 16-bit outputs
//! (f16: 2^-9, bf16: 2^-6): the 16-bit kernels compute in fp32 from the same rounded inputs
//! as the f32 reference and round once on store, so they may land one ulp away. Attention's
//! 16-bit kernels also round their probabilities and score gradients before the next
//! product; their cases get sqrt(n / 16) times that tolerance for the n keys (or query rows)
//! summed (`shim_harness::cases`). The fused loss head rounds its logits to its operands'
//! type by definition, so its 16-bit cases are compared with the CPU backend's op in that
//! type, which rounds them too.
#![allow(
    clippy::panic,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used
)]

mod common;
mod cuda_cases;
mod shim_harness;
mod shim_steps;

use cuda_cases::*;
use memc::codegen::cast_kernel;
use memc::exec::kernels::rng;
use memc::front::train::Precision;
use memc::ir::{DType, TensorType};
use shim_harness::cases::{check_kernel_cases, workspace};
use shim_harness::*;
use shim_steps::{example, example_fused, training_step_matches};

/// One op case at one dtype.
type Case = KernelCase;

/// Every op case in f32, f16 and bf16; ops on f32 scalars only (the loss-scale update) give
/// one kernel for every dtype: it is run once.
fn all_cases() -> Vec<Case> {
    let mut out: Vec<Case> = Vec::new();
    for case in kernel_cases() {
        if !out.iter().any(|c| c.kernel.name == case.kernel.name) {
            out.push(case);
        }
    }
    out
}

#[test]
fn every_kernel_family_matches_the_cpu_backend_through_the_shim() {
    check_kernel_cases(&all_cases());
}

/// The `_slices` norm cases take the split path: a first launch of several blocks per
/// statistics group writing partials to a workspace, and a finishing launch that merges them.
#[test]
fn norm_cases_over_few_large_groups_run_in_slices() {
    let sliced: Vec<Case> = kernel_cases()
        .into_iter()
        .filter(|c| c.label.contains("norm") && c.label.contains("_slices/"))
        .collect();
    assert_eq!(sliced.len(), 8 * 3);
    for case in &sliced {
        let k = &case.kernel;
        assert!(k.finish.is_some(), "{}: one launch", case.label);
        assert!(workspace(case) > 0, "{}: no workspace", case.label);
        assert!(
            !k.source.contains("SLICES = 1ull;"),
            "{}: unsplit",
            case.label
        );
    }
}

/// Promoted arithmetic, cast groups, accumulating norm input gradients and merged norm
/// gradients summing a narrower copy or reading a narrower `dy`, whose inputs' types differ
/// from their output's.
#[test]
fn mixed_type_kernels_match_the_cpu_backend_through_the_shim() {
    let mut cases = mixed_types::promoted_cases();
    cases.extend(mixed_types::cast_group_cases());
    cases.extend(mixed_types::accumulated_norm_cases());
    cases.extend(mixed_types::summed_norm_cases());
    cases.extend(mixed_types::narrow_dy_norm_cases());
    cases.extend(mixed_types::copied_norm_cases());
    cases.extend(mixed_types::add_norm_cases());
    check_kernel_cases(&cases);
}

/// A member of another type than its flat input that is copied, not a view (its input is
/// bound from outside): the CPU backend and the gather kernel decode the same bytes.
#[test]
fn a_member_of_another_type_copies_the_same_bytes_on_both_backends() {
    let want = [1.5f32, -2.0, 3.25, 0.5, 7.0, -0.125];
    let mut flat = vec![9.0f32; 8];
    memc::exec::lowp::pack(DType::BF16, &want, &mut flat[2..]);
    let op = memc::ir::Op::Member {
        offset: 2,
        shape: vec![6],
        dtype: Some(DType::BF16),
    };
    let inputs = [TensorType::new(DType::F32, vec![8])];
    let output = TensorType::new(DType::BF16, vec![6]);
    let cpu = cpu_reference(&op, &inputs, std::slice::from_ref(&flat), 1);
    assert_eq!(cpu.output.as_deref(), Some(&want[..]));
    if let Some(why) = gxx_missing() {
        println!("SKIP: {why}");
        return;
    }
    let kernel = memc::codegen::kernel_for(&op, &inputs, &output)
        .expect("lowered")
        .expect("a kernel");
    let dir = tempfile::tempdir().expect("temp dir");
    let exe = compile(&kernel, dir.path()).expect("compiled");
    let io = (&inputs[..], &output);
    let arena = dir.path().join("member.arena");
    let got = shim_run(&exe, &kernel, io, &[flat], &[], &arena, false, 0).expect("ran");
    assert_eq!(got.output.as_deref(), Some(&want[..]));
}

/// Inputs for the cast kernels: ties, overflow to infinity, subnormals, signed zero, NaN and
/// infinities, then normals over many magnitudes.
/// The update kernels that must equal the CPU kernel bit for bit (8-bit AdamW, stochastic
/// rounding) on the same inputs in their own dtypes, blocks and threads in either order.
#[test]
fn quantized_and_stochastic_updates_match_the_cpu_backend_bit_for_bit() {
    if let Some(why) = gxx_missing() {
        println!("SKIP: {why}");
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let cases = updates::bitwise_kernel_cases();
    let results = par_map(&cases, |case| -> Result<(), String> {
        let exe = compile(&case.kernel, dir.path())?;
        let data = case_data(&case.op, &case.inputs, 11);
        let want = cpu_reference(&case.op, &case.inputs, &data, CASE_STEP);
        let arena = dir.path().join(format!("{}.arena", case.kernel.name));
        for reverse in [false, true] {
            let got = shim_run(
                &exe,
                &case.kernel,
                (&case.inputs, &case.output),
                &data,
                case.op.mutated_inputs(),
                &arena,
                reverse,
                workspace(case),
            )?;
            let differ = got
                .bits()
                .iter()
                .zip(want.bits())
                .filter(|(g, w)| **g != *w)
                .count();
            if differ > 0 || got.bits().len() != want.bits().len() {
                return Err(format!("{differ} values differ (reverse order: {reverse})"));
            }
        }
        // The step moved every parameter off its input somewhere.
        let (i, moved) = &got_params(&want);
        if data[*i] == *moved {
            return Err("the update left the parameters as they were".to_string());
        }
        Ok(())
    });
    let failures: Vec<String> = cases
        .iter()
        .zip(&results)
        .filter_map(|(c, r)| r.as_ref().err().map(|e| format!("{}: {e}", c.label)))
        .collect();
    println!("{} update kernels bit-exact", cases.len() - failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The updated parameters (input 0) of an update's results.
fn got_params(r: &Results) -> (usize, Vec<f32>) {
    r.updated[0].clone()
}

fn cast_inputs(n: usize) -> Vec<f32> {
    let ulp16 = 2f32.powi(-11);
    let mut xs = vec![
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        65504.0,
        65519.0,
        65520.0,
        -65520.0,
        1.0 + ulp16,
        1.0 + 3.0 * ulp16,
        1.0 + 2f32.powi(-8),
        1.0 + 3.0 * 2f32.powi(-8),
        2f32.powi(-24),
        2f32.powi(-25),
        1.5 * 2f32.powi(-25),
        1e-7,
        -3e-6,
        6.1e-5,
        3.3e38,
        f32::MAX,
        f32::MIN_POSITIVE,
    ];
    let magnitudes = n - xs.len();
    xs.extend((0..magnitudes).map(|i| {
        let exp = (i % 60) as i32 - 30;
        rng::normal01(11, 0, i as u64) * 2f32.powi(exp)
    }));
    xs
}

#[test]
fn cast_kernels_round_like_the_half_crate() {
    if let Some(why) = gxx_missing() {
        println!("SKIP: {why}");
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let floats = [DType::F32, DType::F16, DType::BF16];
    let pairs: Vec<(DType, DType)> = floats
        .iter()
        .flat_map(|&a| floats.iter().map(move |&b| (a, b)))
        .filter(|(a, b)| a != b)
        .collect();
    let n = 1000;
    let results = par_map(&pairs, |&(from, to)| {
        let kernel = cast_kernel(from, to, n as u64);
        let exe = compile(&kernel, dir.path())?;
        let (tin, tout) = (TensorType::new(from, vec![n]), TensorType::new(to, vec![n]));
        let xs: Vec<f32> = cast_inputs(n).iter().map(|&v| round_to(from, v)).collect();
        let arena = dir.path().join(format!("{}.arena", kernel.name));
        let got = shim_run(
            &exe,
            &kernel,
            (&[tin], &tout),
            std::slice::from_ref(&xs),
            &[],
            &arena,
            false,
            0,
        )?;
        let got = got.output.ok_or("no output")?;
        let bad = xs
            .iter()
            .zip(&got)
            .filter(|(&x, &g)| {
                let want = round_to(to, x);
                !(want.to_bits() == g.to_bits() || (want.is_nan() && g.is_nan()))
            })
            .map(|(x, g)| format!("{x:e} -> {g:e}"))
            .collect::<Vec<_>>();
        if bad.is_empty() {
            Ok(())
        } else {
            Err(format!("{from}->{to}: {}", bad.join(", ")))
        }
    });
    let failures: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    println!(
        "casts: {} of {} kernels bit-exact",
        pairs.len() - failures.len(),
        pairs.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn small_training_steps_through_the_shim_match_the_cpu_backend() {
    if let Some(why) = gxx_missing() {
        println!("SKIP: {why}");
        return;
    }
    // GPT-2 (learned positions, layernorm, gelu MLP, causal attention, tied embeddings;
    // AdamW), Llama (rmsnorm, rope, silu gating) and the MLP (SGD), all tiny.
    let gpt2 = [("B", 2), ("T", 8), ("D", 32), ("H", 2), ("V", 64), ("L", 2)];
    let llama = [
        ("B", 1),
        ("T", 8),
        ("D", 32),
        ("H", 2),
        ("V", 64),
        ("L", 1),
        ("F", 48),
    ];
    let mlp = [("B", 4), ("H", 32)];
    for (name, dims) in [("gpt2", &gpt2[..]), ("llama7b", &llama), ("mlp", &mlp)] {
        training_step_matches(name, &example(name, dims, Precision::Fp32), DType::F32);
    }
    // Mixed precision: bf16 (casts, bf16 matmul/attention) and fp16 (plus loss scaling).
    // Gradients pass through 16-bit tensors, so they get the tolerance of that format.
    training_step_matches(
        "gpt2",
        &example("gpt2", &gpt2, Precision::Bf16),
        DType::BF16,
    );
    // fp16 with the fused loss head and with the unfused one (which rounds the logits'
    // gradient to fp16 first).
    training_step_matches("gpt2", &example("gpt2", &gpt2, Precision::Fp16), DType::F16);
    let unfused = example_fused("gpt2", &gpt2, Precision::Fp16, false);
    training_step_matches("gpt2 (unfused head)", &unfused, DType::F16);
}
