//! Pipeline parallelism: P stages over M micro-batches in 1F1B order (and data replicas of
//! them, with ZeRO) train as one rank with the whole batch up to fp32 summation order, each
//! stage's rank has exact bytes, each stage holds the saved activations of min(P - s, M)
//! micro-batches at its peak, and the refusals name what they refuse.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use common::{compiled_with, example, overrides};
use memc::budget::CheckpointMode;
use memc::ir::Op;
use memc::parallel::Parallel;
use memc::settings::Precision;
use memc::Options;

const GPT: &[(&str, i64)] = common::PARALLEL_GPT;
const LLAMA: &[(&str, i64)] = common::PARALLEL_LLAMA;

/// A layout: pipeline stages, micro-batches, data replicas, ZeRO stage, tensor ranks.
#[derive(Debug, Clone, Copy)]
struct Layout {
    pipeline: u32,
    microbatches: u32,
    data: u32,
    zero: u8,
    tensor: u32,
}

const ONE: Layout = Layout {
    pipeline: 1,
    microbatches: 1,
    data: 1,
    zero: 0,
    tensor: 1,
};

/// `dims` at batch `batch` in `precision` over `layout` (the batch split over the data
/// replicas, then into the micro-batches).
fn options(dims: &[(&str, i64)], batch: i64, precision: Precision, l: Layout) -> Options {
    let mut dims = dims.to_vec();
    dims.push(("B", batch));
    Options {
        overrides: overrides(&dims),
        precision: Some(precision),
        parallel: (l.pipeline * l.data * l.tensor > 1).then_some(Parallel {
            data: l.data,
            zero: l.zero,
            pipeline: l.pipeline,
            microbatches: l.microbatches,
            tensor: l.tensor,
            global_batch: true,
        }),
        ..Options::default()
    }
}

/// Two stages over two and four micro-batches, two replicas of two stages at ZeRO-0, 1
/// and 3, and two stages of two tensor ranks (alone and in two replicas) print the losses
/// of one rank with the whole batch on a small GPT-2 (its embedding tied to the loss head
/// across the stages) and a small LLaMA, within fp32 summation order, and in bf16 within
/// its rounding.
#[test]
fn pipeline_stages_train_as_one_rank() {
    let layouts = [
        (2, 2, 1, 0, 1),
        (2, 4, 1, 0, 1),
        (2, 2, 2, 0, 1),
        (2, 2, 2, 1, 1),
        (2, 1, 2, 3, 1),
        (2, 2, 1, 0, 2),
        (2, 2, 2, 2, 2),
    ]
    .map(|(pipeline, microbatches, data, zero, tensor)| Layout {
        pipeline,
        microbatches,
        data,
        zero,
        tensor,
    });
    for (model, dims) in [("gpt2", GPT), ("llama7b", LLAMA)] {
        for (precision, tolerance) in [(Precision::Fp32, 2e-6), (Precision::Bf16, 1e-4)] {
            let one = common::rank_losses(model, &options(dims, 4, precision, ONE), 3);
            for layout in layouts {
                let many = common::rank_losses(model, &options(dims, 4, precision, layout), 3);
                let what = format!("{model} {precision:?} {layout:?}");
                common::assert_losses_close(&one, &many, tolerance, &what);
            }
        }
    }
}

/// Exact per-rank bytes of the small GPT-2 over two stages and two micro-batches in fp32:
/// stage 1 holds the embeddings and the first block, stage 2 the second block and the
/// final norm (the tied embedding reaches its loss head with each micro-batch).
#[test]
fn stage_ranks_have_exact_bytes() {
    let (d, v, t) = (64u64, 128u64, 16u64);
    let block = 12 * d * d + 13 * d;
    let params = [v * d + t * d + block, block + 2 * d];
    let layout = Layout {
        pipeline: 2,
        microbatches: 2,
        ..ONE
    };
    let c = compiled_with(&example("gpt2"), &options(GPT, 4, Precision::Fp32, layout));
    let r = c.plan.plan().report.parallel.clone().unwrap();
    assert_eq!((r.pipeline, r.microbatches, r.roles), (2, 2, 2));
    assert_eq!(r.per_rank.len(), 2);
    for (s, e) in r.per_rank.iter().enumerate() {
        assert_eq!(e.rank, s as u32);
        assert_eq!(
            e.role,
            format!("stage {} of 2, data-parallel replica", s + 1)
        );
        assert_eq!(e.bytes.params, 4 * params[s], "stage {s}");
        assert_eq!(e.bytes.grads, 4 * params[s], "stage {s}");
        assert_eq!(e.bytes.optimizer, 8 * params[s], "stage {s}");
    }
    let measured = r.per_rank.iter().map(|e| {
        let b = e.bytes;
        (b.activations, b.comm, b.peak, b.arena)
    });
    assert_eq!(
        measured.collect::<Vec<_>>(),
        [
            (262_400, 32_768, 1_281_796, 1_281_796),
            (180_484, 40_960, 1_067_268, 1_067_268)
        ]
    );
    assert_eq!(c.plan.plan().stages.len(), 1);
}

/// Saved activations at each stage's peak, every value kept (no recomputation): stage `s`
/// of `P` over `M` micro-batches holds `min(P - s, M)` micro-batches' worth of what it
/// holds over one, and the last stage one (and the 4-byte scale its mean's backward reads).
#[test]
fn one_forward_one_backward_holds_min_p_minus_s_micro_batches() {
    let stage_activations = |layers: i64, p: u32, m: u32| -> Vec<u64> {
        let mut dims = GPT.to_vec();
        dims[0] = ("L", layers);
        let layout = Layout {
            pipeline: p,
            microbatches: m,
            ..ONE
        };
        let o = Options {
            checkpoint: CheckpointMode::KeepAll,
            ..options(&dims, i64::from(m), Precision::Fp32, layout)
        };
        let c = compiled_with(&example("gpt2"), &o);
        let r = c.plan.plan().report.parallel.clone().unwrap();
        r.per_rank.iter().map(|e| e.bytes.activations).collect()
    };
    let one = stage_activations(2, 2, 1);
    assert_eq!(one, [65_600, 106_624]);
    let four = stage_activations(2, 2, 4);
    assert_eq!(four, [2 * one[0], one[1] + 4]);
    assert!(four[0] > four[1] && four[0] > one[0]);
    let one = stage_activations(4, 4, 1);
    assert_eq!(one, [65_600, 65_536, 65_536, 106_624]);
    for m in [2, 8] {
        let held = stage_activations(4, 4, m);
        let want: Vec<u64> = (0..4u32)
            .map(|s| u64::from((4 - s).min(m)) * one[s as usize] + u64::from(s == 3) * 4)
            .collect();
        assert_eq!(held, want, "M = {m}");
    }
}

/// The steps of stage 1 of 2 over 4 micro-batches, which the executor runs in plan order,
/// send and receive in 1F1B order: the activations of micro-batches 0 and 1 forward, then
/// each gradient back before the next micro-batch's activation goes out.
#[test]
fn stage_steps_run_in_one_forward_one_backward_order() {
    let layout = Layout {
        pipeline: 2,
        microbatches: 4,
        ..ONE
    };
    let c = compiled_with(&example("gpt2"), &options(GPT, 4, Precision::Fp32, layout));
    let exchanges: Vec<String> = (c.plan.plan().steps.iter())
        .filter_map(|s| match &s.op {
            Op::PipelineSend(l) if !l.gradient => Some(format!("F{}", l.micro)),
            Op::PipelineRecv { link, .. } if link.gradient => Some(format!("B{}", link.micro)),
            _ => None,
        })
        .collect();
    // The tied embedding goes out with each micro-batch's activations, and comes back.
    let mut order = exchanges.clone();
    order.dedup();
    assert_eq!(order.join(" "), "F0 F1 B0 F2 B1 F3 B2 B3");
    assert_eq!(exchanges.len(), 16);
}

/// More stages than blocks and a batch the micro-batches do not divide are refused with a
/// diagnostic that points at the source (the corpus `tests/errors/parallel_*pipeline*.mdl`
/// and `parallel_microbatches_without_pipeline.mdl` pins the rendered diagnostics).
#[test]
fn pipeline_refusals_point_at_the_source() {
    for (dims, layout, message) in [
        (
            GPT,
            Layout {
                pipeline: 4,
                microbatches: 4,
                ..ONE
            },
            "pipeline = 4 cuts the model's blocks into 4 stages, and it has 2 block",
        ),
        (
            GPT,
            Layout {
                pipeline: 2,
                microbatches: 3,
                ..ONE
            },
            "does not split into microbatches = 3",
        ),
    ] {
        let e = common::user_error(&example("gpt2"), &options(dims, 4, Precision::Fp32, layout));
        assert!(e.message.contains(message), "{layout:?}: {}", e.message);
        assert!(e.span.is_some(), "{layout:?}: {}", e.message);
    }
}

/// `memc run --parallel pipeline=2,microbatches=4` (and with two replicas, or two tensor
/// ranks a stage) prints the per-step loss lines of one rank, and `memc compile` prints a
/// line per stage's ranks.
#[test]
fn the_command_line_runs_pipeline_stages() {
    let dims: Vec<String> = (LLAMA.iter().chain(&[("B", 4)]))
        .flat_map(|(k, v)| ["--set".to_string(), format!("{k}={v}")])
        .collect();
    let run = |command: &str, extra: &[&str]| {
        let mut args = vec![command, "examples/llama7b.mdl"];
        args.extend(dims.iter().map(String::as_str));
        args.extend(extra);
        common::stdout_of(&args)
    };
    let steps = |text: String| common::step_lines(&text);
    let one = steps(run("run", &["--steps", "2"]));
    assert_eq!(one.len(), 2);
    for layout in [
        "pipeline=2,microbatches=4",
        "pipeline=2,microbatches=2,data=2,batch=global",
        "pipeline=2,microbatches=2,tensor=2",
    ] {
        let lines = steps(run("run", &["--steps", "2", "--parallel", layout]));
        assert_eq!(lines, one, "{layout}");
    }
    let report = run("compile", &["--parallel", "pipeline=2,microbatches=4"]);
    let stages: Vec<&str> = report.lines().filter(|l| l.contains("ranks ")).collect();
    assert_eq!(stages.len(), 2, "{report}");
    assert!(
        stages[0].contains("ranks 0-0 (stage 1 of 2"),
        "{}",
        stages[0]
    );
    assert!(
        stages[1].contains("ranks 1-1 (stage 2 of 2"),
        "{}",
        stages[1]
    );
}
