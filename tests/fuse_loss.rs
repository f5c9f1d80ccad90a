//! The fused loss head (`passes::fuse_loss`): `cross_entropy(x @ w, t)` becomes the chunked
//! `linear_cross_entropy`, which gives the unfused step's loss and gradients (fp32: up to
//! summation order; bf16/fp16: up to the unfused step's rounding of the logits and their
//! gradient to 16 bits, which the fused op keeps in fp32), saves no logits (exact bytes
//! asserted), shrinks its chunk under a tight budget, and takes a workspace on CUDA.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use common::{compiled_with, example, executor, tiny_gpt};
use memc::front::train::Precision;
use memc::ir::{CeParams, LceGrad, LinearCe, Op};
use memc::plan::{Plan, Target};
use memc::{Compiled, Options};
use std::collections::HashMap;

fn gpt(precision: Precision, fuse_loss: bool) -> Compiled {
    gpt_from(&example("gpt2"), precision, fuse_loss)
}

/// The tiny GPT-2 whose loss ignores the target -100.
fn gpt_ignoring(precision: Precision, fuse_loss: bool) -> Compiled {
    let src = example("gpt2").replace(", targets)", ", targets, ignore_index = -100)");
    gpt_from(&src, precision, fuse_loss)
}

fn gpt_from(src: &str, precision: Precision, fuse_loss: bool) -> Compiled {
    compiled_with(
        src,
        &Options {
            overrides: tiny_gpt(2),
            precision: Some(precision),
            fuse_loss,
            ..Options::default()
        },
    )
}

/// The loss and every parameter's gradient of one step from seed 7.
fn step(c: &Compiled) -> (f32, HashMap<String, Vec<f32>>) {
    step_with(c, None)
}

/// [`step`] with the input `targets` bound to `targets` when given.
fn step_with(c: &Compiled, targets: Option<&[i32]>) -> (f32, HashMap<String, Vec<f32>>) {
    let mut ex = executor(c, 7);
    if let Some(ids) = targets {
        let input = ex.plan().inputs.iter().find(|i| i.name == "targets");
        ex.bind_ids(input.expect("targets").buffer, ids)
            .expect("bind");
    }
    let mut grads = HashMap::new();
    ex.run_step(Some(&mut |name: &str, g: &[f32]| {
        grads.insert(name.to_string(), g.to_vec());
    }))
    .expect("step");
    (ex.output("loss").expect("loss")[0], grads)
}

/// Relative L2 error of `got` against `want`.
fn rel(got: &[f32], want: &[f32]) -> f64 {
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (f64::from(g) - f64::from(w)).powi(2))
        .sum();
    let den: f64 = want.iter().map(|&w| f64::from(w).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// The fused loss head's ops in a plan.
fn head_ops(plan: &Plan) -> Vec<&Op> {
    plan.steps
        .iter()
        .map(|s| &s.op)
        .filter(|op| {
            matches!(
                op,
                Op::LinearCrossEntropy(_) | Op::LinearCrossEntropyBackward { .. }
            )
        })
        .collect()
}

/// Fused and unfused steps agree: fp32 within summation order (loss 1e-6, gradients 1e-5
/// relative); bf16 and fp16 within the unfused step's rounding of logits and their gradient
/// to 16 bits (loss 2^-8 relative for bf16, 2^-11 for fp16; gradients 2^-6 and 2^-9). The
/// tied embedding's gradient includes the head's, so it is compared too.
#[test]
fn fused_and_unfused_steps_agree_in_every_precision() {
    for (precision, loss_tol, grad_tol) in [
        (Precision::Fp32, 1e-6, 1e-5),
        (Precision::Bf16, 2f64.powi(-8), 2f64.powi(-6)),
        (Precision::Fp16, 2f64.powi(-11), 2f64.powi(-9)),
    ] {
        let (fused, unfused) = (gpt(precision, true), gpt(precision, false));
        assert_eq!(head_ops(fused.plan.plan()).len(), 3, "{precision:?}: fused");
        assert!(head_ops(unfused.plan.plan()).is_empty());
        let ((lf, gf), (lu, gu)) = (step(&fused), step(&unfused));
        let loss_err = f64::from((lf - lu).abs()) / f64::from(lu.abs());
        assert!(
            loss_err <= loss_tol,
            "{precision:?}: loss {lf} fused vs {lu} unfused"
        );
        assert_eq!(gf.len(), gu.len());
        for (name, g) in &gu {
            let err = rel(&gf[name], g);
            assert!(
                err <= grad_tol,
                "{precision:?}: {name} gradient differs by {err:e} relative"
            );
        }
    }
}

/// The tiny GPT-2's 2 x 16 targets with every third one -100.
fn some_ignored() -> Vec<i32> {
    (0..32)
        .map(|j| if j % 3 == 1 { -100 } else { (j * 7) % 64 })
        .collect()
}

/// With ignored targets, fused and unfused steps agree as without (fp32: loss 1e-6, gradients
/// 1e-5 relative; bf16 within its rounding), each plan counts the kept rows in one step, and
/// `memc run` accepts -100 in the targets. The loss differs from the one over all rows.
#[test]
fn fused_and_unfused_steps_agree_with_ignored_rows() {
    let targets = some_ignored();
    for (precision, loss_tol, grad_tol) in [
        (Precision::Fp32, 1e-6, 1e-5),
        (Precision::Bf16, 2f64.powi(-8), 2f64.powi(-6)),
    ] {
        let (fused, unfused) = (
            gpt_ignoring(precision, true),
            gpt_ignoring(precision, false),
        );
        assert_eq!(head_ops(fused.plan.plan()).len(), 3, "{precision:?}: fused");
        for c in [&fused, &unfused] {
            let plan = c.plan.plan();
            let counts = plan.steps.iter().filter(|s| s.op.name() == "kept_count");
            assert_eq!(counts.count(), 1, "{precision:?}: one count a step");
            let input = plan.inputs.iter().find(|i| i.name == "targets");
            assert_eq!(input.and_then(|i| i.id_ignored), Some(-100));
        }
        let (lf, gf) = step_with(&fused, Some(&targets));
        let (lu, gu) = step_with(&unfused, Some(&targets));
        let loss_err = f64::from((lf - lu).abs()) / f64::from(lu.abs());
        assert!(loss_err <= loss_tol, "{precision:?}: loss {lf} vs {lu}");
        for (name, g) in &gu {
            let err = rel(&gf[name], g);
            assert!(err <= grad_tol, "{precision:?}: {name} differs by {err:e}");
        }
        let kept: Vec<i32> = targets.iter().map(|&t| t.max(0)).collect();
        let (all_rows, _) = step_with(&unfused, Some(&kept));
        assert!((all_rows - lu).abs() > 1e-3, "{all_rows} vs {lu}");
    }
}

/// Every target ignored: loss 0 and every gradient 0, fused and unfused (PyTorch gives NaN).
#[test]
fn every_row_ignored_gives_zero_loss_and_gradients() {
    let targets = vec![-100; 32];
    for fuse in [true, false] {
        let (loss, grads) = step_with(&gpt_ignoring(Precision::Fp32, fuse), Some(&targets));
        assert_eq!(loss, 0.0, "fused: {fuse}");
        for (name, g) in &grads {
            assert!(g.iter().all(|&v| v == 0.0), "fused {fuse}: {name} is not 0");
        }
    }
}

/// Exact bytes of the tiny GPT-2 at bf16 (B=2, T=16, D=32, V=64): the fused head saves its
/// 32 f32 row losses instead of the 2x16x64 bf16 logits, its chunk is the 16 rows whose bf16
/// logits take the bytes of the bf16 hidden states (32 rows x 32 / 64), and each of its three
/// steps has as many bytes of fp32 logits (8 rows, 2 KiB) as CPU workspace.
#[test]
fn fused_bf16_plan_bytes_are_exact() {
    let (fused, unfused) = (gpt(Precision::Bf16, true), gpt(Precision::Bf16, false));
    let (f, u) = (fused.plan.plan(), unfused.plan.plan());
    let chunk = 32 * 32 / 64;
    assert_eq!(chunk, 16);
    for op in head_ops(f) {
        let (Op::LinearCrossEntropy(lce) | Op::LinearCrossEntropyBackward { lce, .. }) = op else {
            unreachable!()
        };
        assert_eq!(
            *lce,
            LinearCe {
                chunk,
                transposed: true,
                ce: CeParams::default(),
            }
        );
    }
    let saved = |p: &Plan, name: &str| {
        p.report
            .saved
            .iter()
            .find(|s| s.op == name)
            .map_or(0, |s| s.bytes)
    };
    assert_eq!(saved(f, "linear_cross_entropy"), 32 * 4);
    // Beyond the linears' outputs both keep, the unfused head keeps its bf16 logits.
    assert_eq!(saved(u, "matmul") - saved(f, "matmul"), 2 * 16 * 64 * 2);
    assert_eq!(f.report.bytes.workspace, 3 * chunk as u64 * 64 * 2);
    assert_eq!(u.report.bytes.workspace, 0);
    assert_eq!(
        (f.arena_bytes, f.report.bytes.activations),
        (FUSED_ARENA, FUSED_SAVED)
    );
}

/// The tiny GPT-2's fused bf16 plan: arena and saved-activation bytes (256 of the arena
/// are small gradients waiting for their scope's grouped AdamW update).
const FUSED_ARENA: u64 = 786_436;
const FUSED_SAVED: u64 = 94_336;

/// On CUDA the steps made of cuBLASLt GEMMs take a workspace ending in cuBLASLt's 4 MiB of
/// scratch: the matmuls that alone; the fused head its chunk of bf16 logits (forward all 32
/// rows, backward 16 rows of 64 classes, or all 32 rows of a 32-column tile for the weight
/// gradient), the rows' log-sum-exps and their gradient in bf16, each region rounded to 256
/// bytes;
/// attention's backward its scores. So do the layer norms' weight and bias gradients (their
/// fp32 partials per row chunk and channel, merged or not) and the grouped AdamW updates (their tensor
/// table); no other step does.
#[test]
fn the_cuda_plan_gives_its_library_steps_their_workspace() {
    let c = compiled_with(
        &example("gpt2"),
        &Options {
            overrides: tiny_gpt(2),
            precision: Some(Precision::Bf16),
            target: Target::CUDA_MIN,
            ..Options::default()
        },
    );
    let plan = c.plan.plan();
    let cublas = 4u64 << 20;
    for s in &plan.steps {
        let ws = s.workspace.map_or(0, |w| plan.buffers[w.index()].bytes);
        match &s.op {
            Op::LinearCrossEntropy(lce) => {
                // Widened to all 32 rows, the room the step's peak leaves where it runs; its
                // rows' partial log-sum-exps: one slice of 64 classes each.
                assert_eq!(lce.chunk, 32);
                assert_eq!(ws, 32 * 64 * 2 + 256 + cublas);
            }
            // Chunks of 16 rows and 32 rows in all, fewer than an H100's SMs: the logits'
            // gradient is written apart from them, after the other regions. The two ops stay
            // apart: merged, the fp32 input gradient (32 x 32 x 4 bytes) would take more than
            // the logits it leaves and raise the step's peak.
            Op::LinearCrossEntropyBackward { which, .. } => {
                assert_ne!(
                    *which,
                    LceGrad::Both,
                    "the merged head raises this step's peak"
                );
                let logits = 16 * 64 * 2;
                assert_eq!(ws, logits + 256 + logits + cublas);
            }
            Op::MatMul { .. } => assert_eq!(ws, cublas),
            // All 4 heads of 16 rows and 16 keys at once, dq's, dk's and dv's units in turn:
            // fp32 scores and bf16 probabilities, fp32 dp and bf16 ds.
            Op::PackedAttentionBackward(_) => assert_eq!(ws, 4 * 16 * 16 * 2 * (4 + 2) + cublas),
            // 32 rows (2 x 16 tokens), a chunk each, of 32 channels; merged, one such fp32
            // partial per chunk and channel for each gradient it sums.
            Op::NormBackwardWeight { .. } | Op::NormBackwardBias { .. } => {
                assert_eq!(ws, 32 * 32 * 4);
            }
            Op::NormBackward { bias, sum, .. } => {
                let sums = 1 + u64::from(*bias) + u64::from(sum.is_some());
                assert_eq!(ws, 32 * 32 * 4 * sums);
            }
            // Its tensor table: 24 bytes for each parameter, gradient and moment.
            Op::AdamWGroup { tensors, .. } => assert_eq!(ws, 4 * 24 * u64::from(*tensors)),
            // Its table of inputs: 24 bytes for each parameter cast.
            Op::CastGroup { tensors, .. } => assert_eq!(ws, 24 * u64::from(*tensors)),
            op => assert_eq!(ws, 0, "{}", op.name()),
        }
    }
}

/// A budget that only a smaller chunk meets: a head whose chunk's logits (128 rows of 32
/// classes, 16 KiB, as large as the hidden states) sit on the peak; with recomputation off,
/// the chunks halve until the plan fits.
#[test]
fn a_tight_budget_shrinks_the_chunk() {
    let src = "model head {\n  dim N = 256, D = 16, V = 32\n  param h: [N, D] = normal(1.0)\n  param w: [D, V] = normal(0.5)\n  input t: i32[N]\n  loss = cross_entropy(h @ w, t)\n  train { optimizer = sgd(lr = 0.1) }\n}\n";
    let options = |budget| Options {
        checkpoint: memc::budget::CheckpointMode::KeepAll,
        budget,
        ..Options::default()
    };
    let chunks = |c: &Compiled| -> Vec<usize> {
        head_ops(c.plan.plan())
            .into_iter()
            .filter_map(|op| match op {
                Op::LinearCrossEntropy(lce) | Op::LinearCrossEntropyBackward { lce, .. } => {
                    Some(lce.chunk)
                }
                _ => None,
            })
            .collect()
    };
    let default = compiled_with(src, &options(None));
    assert_eq!(chunks(&default), [128, 128, 128]);
    let budget = default.plan.plan().arena_bytes - 1;
    let tight = compiled_with(src, &options(Some(budget)));
    assert!(tight.plan.plan().arena_bytes <= budget);
    assert_eq!(chunks(&tight), [64, 64, 64]);
}

/// Logits something else reads stay a matmul: only the loss head is fused.
#[test]
fn logits_read_elsewhere_are_not_fused() {
    let src = "model head {\n  dim N = 6, D = 4, V = 5\n  input x: [N, D]\n  input t: i32[N]\n  param w: [D, V] = normal(0.5)\n  let z = x @ w\n  loss = cross_entropy(z, t) + mean(z)\n  train { optimizer = sgd(lr = 0.1) }\n}\n";
    let c = compiled_with(src, &Options::default());
    assert!(head_ops(c.plan.plan()).is_empty());
    let fused = src.replace(" + mean(z)", "");
    let c = compiled_with(&fused, &Options::default());
    assert_eq!(
        head_ops(c.plan.plan()).len(),
        2,
        "forward and dw (x is an input)"
    );
}

/// The fused head still bounds its targets by the classes (`memc run` refuses other ids).
#[test]
fn fused_targets_are_bounded_by_the_classes() {
    let c = gpt(Precision::Fp32, true);
    let targets = c.plan.plan().inputs.iter().find(|i| i.name == "targets");
    assert_eq!(targets.and_then(|t| t.id_limit), Some(64));
}

/// Two heads reading one `transpose(e)` both read `e` in place: no transpose is left; a
/// transpose something else reads stays for that reader.
#[test]
fn a_shared_transpose_is_dropped_once_every_head_is_fused() {
    let src = |extra: &str| {
        format!("model heads {{\n  dim N = 6, D = 4, V = 5\n  param x: [N, D] = normal(1.0)\n  param y: [N, D] = normal(1.0)\n  param e: [V, D] = normal(0.5)\n  input t: i32[N]\n  let wt = transpose(e)\n  loss = cross_entropy(x @ wt, t) + cross_entropy(y @ wt, t){extra}\n  train {{ optimizer = sgd(lr = 0.1) }}\n}}\n")
    };
    let permutes = |c: &Compiled| {
        let plan = c.plan.plan();
        plan.steps
            .iter()
            .filter(|s| s.phase == memc::ir::Phase::Forward && s.op.name() == "permute")
            .count()
    };
    let both = compiled_with(&src(""), &Options::default());
    assert_eq!(head_ops(both.plan.plan()).len(), 6);
    assert_eq!(permutes(&both), 0);
    let read = compiled_with(&src(" + mean(wt)"), &Options::default());
    assert_eq!(head_ops(read.plan.plan()).len(), 6);
    assert_eq!(permutes(&read), 1);
}

/// The backward ops of a CUDA head merge only where the weight's gradient is a value of its
/// own: an fp32 LLaMA's untied head weight is a parameter, whose gradient buffer the update
/// reads, so its pair stays apart; in bf16 the head reads the weight's bf16 copy, whose
/// gradient is a temporary, and the pair is one op (the peak unchanged).
#[test]
fn a_parameter_s_own_gradient_keeps_the_head_backward_apart() {
    let dims = common::overrides(&[
        ("L", 2),
        ("D", 64),
        ("H", 4),
        ("F", 128),
        ("V", 512),
        ("T", 64),
    ]);
    let head = |precision| {
        let c = compiled_with(
            &example("llama7b"),
            &Options {
                overrides: dims.clone(),
                precision: Some(precision),
                target: Target::CUDA_MIN,
                ..Options::default()
            },
        );
        let ops: Vec<LceGrad> = (c.plan.plan().steps.iter())
            .filter_map(|s| match s.op {
                Op::LinearCrossEntropyBackward { which, .. } => Some(which),
                _ => None,
            })
            .collect();
        ops
    };
    assert_eq!(head(Precision::Fp32), vec![LceGrad::Input, LceGrad::Weight]);
    assert_eq!(head(Precision::Bf16), vec![LceGrad::Both]);
}
