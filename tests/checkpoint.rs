//! Checkpointing: recomputation changes memory, never results — gradients and updated
//! parameters are bitwise identical to the keep-everything plan on the CPU backend under
//! every policy (per-block, every k-th block, sqrt(n), selective, min-cut), dropout and
//! mixed precision included; per-block checkpointing recomputes one block at a time,
//! selective recomputation keeps heavy outputs, widening casts are recomputed, budgets are
//! met, and an impossible budget gets its diagnostic.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use common::{compiled_with, example};
use memc::budget::CheckpointMode;
use memc::exec::cpu::CpuExecutor;
use memc::front::train::Precision;
use memc::ir::{Graph, Phase, ValueId};
use memc::passes::checkpoint::{self, Policy};
use memc::plan::VerifiedPlan;
use memc::plan::{build_for, BuildOptions, Target};
use memc::settings::TrainSummary;
use memc::{CompileError, Options};
use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroUsize;
use std::time::Duration;

/// Every fixed policy that recomputes: pointwise, block, first=1, every=2, sqrt, selective,
/// mincut, and the knapsack's first choice (one instance recomputed more than pointwise).
fn policies() -> [CheckpointMode; 8] {
    [
        CheckpointMode::Knapsack(1),
        CheckpointMode::Pointwise,
        CheckpointMode::BLOCK,
        CheckpointMode::First(NonZeroUsize::MIN),
        CheckpointMode::Every(NonZeroUsize::new(2).unwrap()),
        CheckpointMode::Sqrt,
        CheckpointMode::Selective,
        CheckpointMode::MinCut,
    ]
}

fn small_gpt(checkpoint: CheckpointMode, budget: Option<u64>) -> Options {
    Options {
        overrides: common::tiny_gpt(2),
        checkpoint,
        budget,
        ..Options::default()
    }
}

/// The checkpointing summary of a compiled plan (there is one: something is recomputed).
fn summary_of(c: &memc::Compiled) -> memc::plan::CheckpointSummary {
    c.plan.plan().report.checkpoint.clone().expect("summary")
}

/// Bit patterns of tensors by name.
type Bits = BTreeMap<String, Vec<u32>>;

/// Gradient bits of the first step, parameter bits after two steps, and the bytes saved for
/// backward.
fn fingerprint(src: &str, options: &Options) -> (Bits, Bits, u64) {
    fingerprint_plan(&compiled_with(src, options).plan)
}

/// [`fingerprint`] of a verified plan, from parameters and inputs of seed 11.
fn fingerprint_plan(plan: &VerifiedPlan) -> (Bits, Bits, u64) {
    let mut ex = CpuExecutor::new(plan).expect("cpu plan");
    ex.init_params(11).expect("init");
    ex.synthetic_inputs(11).expect("inputs");
    let mut grads = BTreeMap::new();
    ex.run_step(Some(&mut |n: &str, g: &[f32]| {
        grads.insert(n.to_string(), g.iter().map(|x| x.to_bits()).collect());
    }))
    .expect("step");
    ex.run_step(None).expect("step");
    let params = ex
        .plan()
        .params
        .iter()
        .map(|p| {
            (
                p.name.clone(),
                ex.read(p.buffer).iter().map(|x| x.to_bits()).collect(),
            )
        })
        .collect();
    (grads, params, plan.plan().report.bytes.activations)
}

const DROPOUT_GPT: &str = "model g {
  dim B = 2, T = 8, D = 16, H = 2, V = 32, L = 3
  input tokens: i32[B, T]
  input targets: i32[B, T]
  param wte: [V, D] = normal(0.02)
  block layer(x) {
    param ln: layernorm(D)
    param qkv: linear(D, 3*D)
    param fc: linear(D, 4*D)
    param proj: linear(4*D, D)
    let q, k, v = split(linear(layernorm(x, ln), qkv), 3)
    x = x + dropout(attention(q, k, v, heads = H, causal = true), p = 0.2)
    x = x + dropout(linear(gelu(linear(x, fc)), proj), p = 0.2)
    return x
  }
  let x = repeat L layer(embed(wte, tokens))
  loss = cross_entropy(x @ transpose(wte), targets)
  train { optimizer = adamw(lr = 1e-2) }
}";

/// A GPT with attention written out (`softmax(q @ k^T)` then `@ v`): its attention core is
/// separable, so selective recomputation recomputes both activation matmuls.
const MANUAL_ATTENTION_GPT: &str = "model g {
  dim B = 2, T = 8, D = 16, H = 1, V = 32, L = 3
  input tokens: i32[B, T]
  input targets: i32[B, T]
  param wte: [V, D] = normal(0.02)
  block layer(x) {
    param ln: layernorm(D)
    param qkv: linear(D, 3*D)
    param proj: linear(D, D)
    param fc: linear(D, 4*D)
    param out: linear(4*D, D)
    let q, k, v = split(linear(layernorm(x, ln), qkv), 3)
    let p = dropout(softmax(q @ transpose(k) * 0.25), p = 0.1)
    x = x + linear(p @ v, proj)
    x = x + linear(gelu(linear(x, fc)), out)
    return x
  }
  let x = repeat L layer(embed(wte, tokens))
  loss = cross_entropy(x @ transpose(wte), targets)
  train { optimizer = adamw(lr = 1e-2) }
}";

/// Checkpointing options in `precision` (the file's when None).
fn checkpointed(mode: CheckpointMode, precision: Option<Precision>) -> Options {
    Options {
        precision,
        ..small_gpt(mode, None)
    }
}

#[test]
fn recomputation_is_bitwise_identical() {
    let cases = [
        (example("gpt2"), None),
        (DROPOUT_GPT.to_string(), None),
        (DROPOUT_GPT.to_string(), Some(Precision::Bf16)),
        (MANUAL_ATTENTION_GPT.to_string(), None),
        (MANUAL_ATTENTION_GPT.to_string(), Some(Precision::Fp16)),
    ];
    for (case, (src, precision)) in cases.into_iter().enumerate() {
        let base = fingerprint(&src, &checkpointed(CheckpointMode::KeepAll, precision));
        for mode in policies() {
            let other = fingerprint(&src, &checkpointed(mode, precision));
            assert_eq!(base.0, other.0, "{mode:?}: gradients differ");
            assert_eq!(base.1, other.1, "{mode:?}: parameters differ");
            // A policy saves less; its arena may not be smaller on these tiny steps, where a
            // recomputed block's transients can outweigh what it saves.
            assert!(
                other.2 < base.2,
                "case {case}, {mode:?}: saved {} not below keep-all {}",
                other.2,
                base.2
            );
        }
    }
}

#[test]
fn auto_meets_a_tight_budget_with_identical_results() {
    let src = DROPOUT_GPT.to_string();
    let base = fingerprint(&src, &small_gpt(CheckpointMode::KeepAll, None));
    let mincut = compiled_with(&src, &small_gpt(CheckpointMode::MinCut, None))
        .plan
        .plan()
        .arena_bytes;
    let budget = mincut - 1;
    let fit = compiled_with(&src, &small_gpt(CheckpointMode::Auto, Some(budget)));
    let plan = fit.plan.plan();
    assert!(
        plan.arena_bytes <= budget,
        "arena {} over budget {budget}",
        plan.arena_bytes
    );
    let summary = plan.report.checkpoint.as_ref().expect("checkpoint summary");
    assert!(summary.recompute_flops > 0);
    assert!(
        summary
            .recomputed
            .iter()
            .any(|g| g.op == "matmul" || g.op == "attention"),
        "heavy ops recomputed under a tight budget"
    );
    let again = fingerprint(&src, &small_gpt(CheckpointMode::Auto, Some(budget)));
    assert_eq!(base.0, again.0);
    assert_eq!(base.1, again.1);
}

#[test]
fn impossible_budget_names_the_minimum() {
    let result = memc::compile(
        &example("gpt2"),
        &small_gpt(CheckpointMode::Auto, Some(1 << 16)),
    );
    let Err(CompileError::User(e)) = result else {
        panic!("expected a user error")
    };
    assert!(
        e.message.contains("no plan fits the budget of 64.0 KiB"),
        "{}",
        e.message
    );
    assert!(e.help.contains("minimum feasible budget"), "{}", e.help);
    assert_eq!(e.span, None, "a budget given as an option");
}

#[test]
fn weight_copies_are_made_once_per_step_under_recomputation() {
    let copies = |mode| {
        let c = compiled_with(DROPOUT_GPT, &checkpointed(mode, Some(Precision::Bf16)));
        let p = c
            .plan
            .plan()
            .report
            .precision
            .clone()
            .expect("bf16 summary");
        (p.weight_copies, p.weight_copy_bytes)
    };
    let keep = copies(CheckpointMode::KeepAll);
    assert!(keep.0 > 0);
    for mode in policies() {
        assert_eq!(copies(mode), keep, "{mode:?} recomputed a weight copy");
    }
}

/// The training graph of `src` in `precision` as checkpointing receives it (the optimizer
/// in backward), and its `train { }` settings.
fn training_graph(
    src: &str,
    overrides: &[(String, i64)],
    precision: Precision,
) -> (Graph, TrainSummary) {
    let ast = memc::front::parse(src).unwrap();
    let module = memc::front::lower(&ast, overrides).unwrap();
    let mut train = module.train.unwrap().settings;
    train.precision = precision;
    let loss = module.graph.output("loss").unwrap();
    let mixed = memc::passes::precision::run(&module.graph, loss, precision, true).unwrap();
    let diff = memc::passes::autodiff::run(&mixed.graph, mixed.objective).unwrap();
    let diff = memc::passes::widen::run(&diff).unwrap();
    let options = memc::passes::optimizer::OptimizerOptions {
        optimizer: train.optimizer,
        clip_grad_norm: train.clip_grad_norm,
        loss_scale: mixed.loss_scale,
        accumulate: train.accumulate,
        stochastic_rounding: train.stochastic_rounding,
        offload: false,
        clip_span: None,
        parallel: None,
        masters: false,
    };
    let graph = memc::passes::optimizer::run(&diff, &options).unwrap();
    (graph, train)
}

/// The verified CPU plan of `graph` with the values of `recompute` recomputed.
fn plan_recomputing(
    graph: &Graph,
    train: &TrainSummary,
    recompute: &BTreeSet<ValueId>,
) -> VerifiedPlan {
    let rewritten = checkpoint::rewrite(graph, recompute).unwrap();
    let options = BuildOptions {
        optimizer_in_backward: true,
        layout_time: Duration::ZERO,
        alignment: Target::Cpu.alignment(),
        pipeline: None,
    };
    let clones = rewritten.clones.iter().map(|&(_, c)| c).collect();
    let graph = &rewritten.graph;
    let plan = build_for(Target::Cpu, "m", graph, Some(train), &options, &clones).unwrap();
    memc::plan::verify(plan).unwrap()
}

#[test]
fn block_recomputes_one_block_at_a_time_and_saves_what_crosses_blocks() {
    for precision in [Precision::Fp32, Precision::Bf16] {
        let (graph, _) = training_graph(DROPOUT_GPT, &common::tiny_gpt(2), precision);
        let recompute = checkpoint::choose(&graph, Policy::Segments { every: 1 });
        let rewritten = checkpoint::rewrite(&graph, &recompute).unwrap();
        let g = &rewritten.graph;
        let clones: BTreeMap<ValueId, ValueId> =
            rewritten.clones.iter().map(|&(o, c)| (c, o)).collect();
        // The backward window of each instance: from its first step (clones included) to its
        // last backward step; creation order is the schedule's order.
        let mut windows: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        for v in g.values() {
            let node = g.node(v);
            let own = checkpoint::instance(&node.scope);
            if node.phase == Phase::Backward && !own.is_empty() {
                let w = windows
                    .entry(own.to_string())
                    .or_insert((v.index(), v.index()));
                w.1 = v.index();
            }
        }
        assert_eq!(windows.len(), 4, "{precision:?}: one window per layer");
        let mut spans: Vec<(usize, usize)> = windows.values().copied().collect();
        spans.sort();
        assert!(
            spans.windows(2).all(|w| w[0].1 < w[1].0),
            "{precision:?}: backward windows of the instances overlap: {spans:?}"
        );
        assert!(!clones.is_empty());
        let dependent = graph.input_dependent();
        for (&c, &original) in &clones {
            let own = checkpoint::instance(&g.node(c).scope).to_string();
            if own.is_empty() {
                // A weight copy outside blocks (the tied embedding's), cast again in backward.
                assert!(checkpoint::is_weight_copy(&graph, &dependent, original));
                continue;
            }
            let (first, last) = windows[&own];
            assert!(
                first <= c.index(),
                "{precision:?}: {c} made before {own}'s backward"
            );
            for reader in g.users(c) {
                assert!(
                    reader.index() <= last && checkpoint::instance(&g.node(reader).scope) == own,
                    "{precision:?}: {c} ({own}) read by {reader} outside its block's backward"
                );
            }
            for user in graph.users(original) {
                let node = graph.node(user);
                assert!(
                    node.phase != Phase::Forward || checkpoint::instance(&node.scope) == own,
                    "{precision:?}: {original} flows from {own} into {user} yet is recomputed"
                );
            }
        }
    }
}

#[test]
fn selective_keeps_heavy_outputs_and_recomputes_the_attention_core() {
    let recomputed = |src: &str| {
        let c = compiled_with(src, &small_gpt(CheckpointMode::Selective, None));
        let summary = c.plan.plan().report.checkpoint.clone().expect("summary");
        let mut ops: BTreeMap<String, u64> = BTreeMap::new();
        for g in summary.recomputed {
            *ops.entry(g.op).or_default() += g.count;
        }
        ops
    };
    // Written-out attention: q @ k^T and p @ v of each of the 4 layers, never a matmul with
    // a weight; softmax, dropout, norms and pointwise ops recomputed.
    let manual = recomputed(MANUAL_ATTENTION_GPT);
    assert_eq!(manual.get("matmul"), Some(&8), "{manual:?}");
    for op in ["softmax", "dropout", "norm", "unary"] {
        assert!(manual.contains_key(op), "{op} not recomputed: {manual:?}");
    }
    // Fused attention: its output is kept like every heavy op's.
    let fused = recomputed(DROPOUT_GPT);
    assert!(
        !fused.contains_key("matmul") && !fused.contains_key("attention"),
        "{fused:?}"
    );
    assert!(fused.contains_key("dropout"), "{fused:?}");
}

#[test]
fn block_and_selective_bytes_are_exact() {
    // DROPOUT_GPT at B=2, T=16, D=32, V=64, L=4 (fp32); layout without search.
    let bytes = |mode| {
        let options = Options {
            layout_time: Duration::ZERO,
            ..small_gpt(mode, None)
        };
        let c = compiled_with(DROPOUT_GPT, &options);
        let plan = c.plan.plan();
        let flops = plan
            .report
            .checkpoint
            .as_ref()
            .map_or(0, |s| s.recompute_flops);
        (plan.report.bytes.activations, plan.arena_bytes, flops)
    };
    let keep = bytes(CheckpointMode::KeepAll);
    let block = bytes(CheckpointMode::BLOCK);
    let selective = bytes(CheckpointMode::Selective);
    // An activation [B, T, D] in fp32 is 4 KiB. Block saves the embedding (layer 0's input),
    // the 4 layer outputs and the fused loss head's per-row losses (B x T x 4 = 128 bytes):
    // 5 x 4 KiB + 128.
    assert_eq!(keep, (233_600, 865_796, 0));
    // Recomputation reads q, k and v packed in the qkv product: no slice is recomputed.
    assert_eq!(block, (20_608, 706_052, 2_109_440));
    // Selective adds the heavy outputs: per layer qkv (12 KiB), attention (4 KiB) and fc
    // (16 KiB), and recomputes no matmul (nor the biases their epilogues add), nor a slice.
    assert_eq!(selective, (151_680, 800_260, 106_496));
    assert_eq!(selective.0, block.0 + 4 * (12 + 4 + 16) * 1024);
}

/// A small convolution step with RMS norms (fp32 under bf16) on convolution outputs.
const RMSNORM_NET: &str = "model rn {
  dim B = 2, C = 8, S = 8
  input x: [B, C, S, S]
  input target: [B, C, S, S]
  param c1: conv2d(C, C, 3, bias = true)
  param n1: rmsnorm(S)
  param c2: conv2d(C, C, 3, bias = true)
  param n2: rmsnorm(S)
  let h = conv2d(silu(rmsnorm(conv2d(x, c1, padding = 1), n1)), c2, padding = 1)
  loss = mse(silu(rmsnorm(h, n2)), target)
  train { optimizer = adamw(lr = 1e-2) }
}";

#[test]
fn widening_casts_are_recomputed_with_identical_gradients() {
    let (graph, train) = training_graph(RMSNORM_NET, &[], Precision::Bf16);
    let widening = checkpoint::widening_casts(&graph);
    assert_eq!(widening.len(), 2, "one fp32 copy per norm input");
    let saved = plan_recomputing(&graph, &train, &BTreeSet::new());
    let recomputed = plan_recomputing(&graph, &train, &widening);
    let casts: BTreeSet<ValueId> = widening
        .iter()
        .chain(&checkpoint::weight_copies(&graph))
        .copied()
        .collect();
    let keep_all = compiled_with(
        RMSNORM_NET,
        &Options {
            precision: Some(Precision::Bf16),
            checkpoint: CheckpointMode::KeepAll,
            layout_time: Duration::ZERO,
            ..Options::default()
        },
    );
    assert_eq!(
        keep_all.plan.plan().report.bytes,
        plan_recomputing(&graph, &train, &casts).plan().report.bytes,
        "keep-all recomputes the widening casts and the weight copies"
    );
    // Each norm input ([B, C, S, S] = 1024 values) is saved as its bf16 source (2 KiB)
    // instead of its fp32 copy (4 KiB).
    let (a, b) = (&saved.plan().report.bytes, &recomputed.plan().report.bytes);
    assert_eq!((a.activations, a.arena), (25_728, 54_816));
    assert_eq!((b.activations, b.arena), (21_632, 52_768));
    assert_eq!(a.activations - b.activations, 2 * 1024 * (4 - 2));
    let (x, y) = (fingerprint_plan(&saved), fingerprint_plan(&recomputed));
    assert_eq!(x.0, y.0, "gradients differ");
    assert_eq!(x.1, y.1, "parameters differ");
    // The recompute figure counts the two widening casts (one FLOP per element, fp32 bytes
    // written) and c2's bf16 weight copy ([C, C, 3, 3] = 576 values), which backward reads.
    let summary = summary_of(&keep_all);
    assert!(
        summary.recomputed.iter().all(|g| g.op == "cast"),
        "{summary:?}"
    );
    assert_eq!(summary.recomputed_bytes, 2 * 1024 * 4 + 576 * 2);
    assert_eq!(summary.recompute_flops, 2 * 1024 + 576);
}

#[test]
fn unet_in_bf16_saves_less_than_in_fp32() {
    let report = |precision| {
        let options = Options {
            precision: Some(precision),
            checkpoint: CheckpointMode::KeepAll,
            layout_time: Duration::ZERO,
            ..Options::default()
        };
        compiled_with(&example("unet"), &options)
            .plan
            .plan()
            .report
            .bytes
            .clone()
    };
    let (fp32, bf16) = (report(Precision::Fp32), report(Precision::Bf16));
    // Before widening casts were recomputed, bf16 saved 33,130,368 bytes (fp32 copies of
    // every group norm input), more than fp32; before weight copies were, 25,700,224; before
    // group norms ran in their input's precision, 21,682,688 (arena 48,876,548).
    assert_eq!((fp32.activations, fp32.arena), (33_091_584, 60_848_388));
    assert_eq!((bf16.activations, bf16.arena), (16_570_880, 43_529_216));
}

#[test]
fn auto_picks_the_fastest_estimate_among_the_policies_that_fit() {
    let quick = |mode, budget| Options {
        layout_time: Duration::ZERO,
        ..small_gpt(mode, budget)
    };
    // Auto ranks by the estimated step time on the H100 (no --gpu given).
    let cost = |c: &memc::Compiled| {
        let plan = c.plan.plan();
        let seconds = memc::cost::estimate(plan, memc::cost::Gpu::H100).seconds;
        (seconds, plan.arena_bytes)
    };
    let fixed: Vec<(CheckpointMode, (f64, u64))> = policies()
        .into_iter()
        .map(|m| (m, cost(&compiled_with(DROPOUT_GPT, &quick(m, None)))))
        .collect();
    let keep = cost(&compiled_with(
        DROPOUT_GPT,
        &quick(CheckpointMode::KeepAll, None),
    ));
    for &(mode, (_, arena)) in &fixed {
        assert!(arena < keep.1, "{mode:?} saves nothing");
        let auto = cost(&compiled_with(
            DROPOUT_GPT,
            &quick(CheckpointMode::Auto, Some(arena)),
        ));
        let best = fixed
            .iter()
            .filter(|(_, (_, a))| *a <= arena)
            .map(|(_, (s, _))| *s)
            .fold(f64::INFINITY, f64::min);
        assert!(
            auto.1 <= arena,
            "budget {arena} ({mode:?}): auto needs {}",
            auto.1
        );
        assert!(
            auto.0 <= best,
            "budget {arena} ({mode:?}): auto takes an estimated {} s, a policy {best} s",
            auto.0
        );
    }
}

/// Without a budget, auto takes the smaller plan of keep-all and pointwise recomputation;
/// on GPT-2's layers pointwise recomputes the GELU, bias adds and layer norms from the
/// values backward keeps anyway, and recomputes no matmul.
#[test]
fn auto_without_a_budget_recomputes_pointwise_ops_only() {
    let quick = |mode| Options {
        layout_time: Duration::ZERO,
        ..small_gpt(mode, None)
    };
    let plan_of = |mode| compiled_with(&example("gpt2"), &quick(mode));
    let (keep, pointwise, auto) = (
        plan_of(CheckpointMode::KeepAll),
        plan_of(CheckpointMode::Pointwise),
        plan_of(CheckpointMode::Auto),
    );
    let bytes = |c: &memc::Compiled| c.plan.plan().report.bytes.clone();
    assert!(bytes(&pointwise).activations < bytes(&keep).activations);
    assert!(bytes(&pointwise).arena < bytes(&keep).arena);
    assert_eq!(bytes(&auto), bytes(&pointwise));
    let summary = summary_of(&pointwise);
    assert!(
        summary.policy.starts_with("pointwise"),
        "{}",
        summary.policy
    );
    assert!(
        summary.recomputed.iter().all(|g| matches!(
            g.op.as_str(),
            "unary" | "binary" | "slice" | "cast" | "reshape" | "norm"
        )),
        "{:?}",
        summary.recomputed
    );
    assert!(summary.recomputed.iter().any(|g| g.op == "unary"));
}

/// Auto mode over twelve budgets from keep-all's arena down to the smallest fixed policy's
/// (as `memc bench checkpoint`): every plan within its budget, its bytes never rising and
/// its recompute never falling as the budget falls, and the first k blocks recomputed in
/// between (a finer step than per-block or every k-th block).
#[test]
fn falling_budgets_give_monotone_plans_within_them() {
    for (name, dims) in [
        ("gpt2", common::tiny_gpt(4)),
        ("unet", common::overrides(&[("B", 2)])),
    ] {
        let options = Options {
            overrides: dims,
            layout_time: Duration::ZERO,
            ..Options::default()
        };
        let sweep = memc::bench::budget_sweep(&example(name), &options, 12).expect("compiles");
        assert!(sweep.minimum < sweep.keep_all, "{name}: {sweep:?}");
        assert!(sweep.all_within(), "{name}: {sweep:?}");
        assert!(sweep.monotone(), "{name}: {sweep:?}");
        let last = sweep.points.last().expect("twelve points");
        assert!(last.recompute_flops > 0, "{name}: {last:?}");
        if name == "gpt2" {
            assert!(
                sweep.points.iter().any(|p| p.policy.starts_with("first=")),
                "{name}: {sweep:?}"
            );
        }
    }
}
