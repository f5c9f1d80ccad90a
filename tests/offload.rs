//! The host tier (`--offload optimizer|activations|all`): the optimizer state, or the
//! activations backward reads, leave the device arena for a host arena of its own, exact
//! bytes; the update runs on host copies, saved activations wait on the host between
//! forward and backward, and the offloaded plan trains bit for bit as the plain one does on
//! the CPU.
#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout
)]

mod common;

use common::{compiled_with, example, executor, loss, overrides, SMALL_GPT};
use memc::budget::CheckpointMode;
use memc::ir::Op;
use memc::plan::{BufferClass, Tier};
use memc::settings::{Offload, Precision};
use memc::Options;

/// A LLaMA small enough to train in tests: 2 layers, D=32, T=16, V=64, 2 heads, F=48, B=2.
const SMALL_LLAMA: &[(&str, i64)] = &[
    ("B", 2),
    ("T", 16),
    ("D", 32),
    ("H", 2),
    ("V", 64),
    ("L", 2),
    ("F", 48),
];

fn offloaded(options: &Options) -> Options {
    Options {
        offload: Some(Offload::Optimizer),
        ..options.clone()
    }
}

/// The bf16 (fp32 master weights) plans of example `model` as written and with `what`
/// offloaded.
fn bf16_plans(model: &str, what: Offload) -> (memc::Compiled, memc::Compiled) {
    let src = example(model);
    let bf16 = Options {
        precision: Some(Precision::Bf16),
        ..Options::default()
    };
    let plain = compiled_with(&src, &bf16);
    let moved = Options {
        offload: Some(what),
        ..bf16
    };
    (plain, compiled_with(&src, &moved))
}

/// Losses of `steps` steps from seed 5 and every parameter's values after them.
fn trained(src: &str, options: &Options, steps: usize) -> (Vec<u32>, Vec<Vec<u32>>) {
    let c = compiled_with(src, options);
    let mut ex = executor(&c, 5);
    let losses = (0..steps).map(|_| loss(&mut ex).to_bits()).collect();
    let plan = c.plan.plan();
    let params = plan
        .params
        .iter()
        .map(|p| ex.read(p.buffer).iter().map(|v| v.to_bits()).collect())
        .collect();
    (losses, params)
}

#[test]
fn offloaded_plans_train_bitwise_like_plain_ones_on_gpt_and_llama() {
    let settings = [
        ("fp32", Options::default()),
        (
            "bf16",
            Options {
                precision: Some(Precision::Bf16),
                ..Options::default()
            },
        ),
        (
            "updates after backward",
            Options {
                optimizer_in_backward: Some(false),
                ..Options::default()
            },
        ),
        (
            "pure bf16",
            Options {
                precision: Some(Precision::Bf16),
                master_weights: Some(false),
                ..Options::default()
            },
        ),
        (
            "LoRA",
            Options {
                lora: Some(memc::passes::lora::LoraSpec::parse("r=4").unwrap()),
                ..Options::default()
            },
        ),
        (
            "int8 state",
            Options {
                optimizer_state: Some(memc::ops::optimizer::StateFormat::Int8),
                ..Options::default()
            },
        ),
        (
            "per-block checkpointing",
            Options {
                checkpoint: CheckpointMode::BLOCK,
                ..Options::default()
            },
        ),
        (
            "accumulation",
            Options {
                accumulate: Some(2),
                ..Options::default()
            },
        ),
    ];
    let kinds = [Offload::Optimizer, Offload::Activations, Offload::All];
    for (model, dims) in [("gpt2", SMALL_GPT), ("llama7b", SMALL_LLAMA)] {
        let src = example(model);
        for ((label, options), what) in settings.iter().flat_map(|s| kinds.map(|k| (s, k))) {
            let options = Options {
                overrides: overrides(dims),
                ..options.clone()
            };
            let moved = Options {
                offload: Some(what),
                ..options.clone()
            };
            let plain = trained(&src, &options, 3);
            let off = trained(&src, &moved, 3);
            let c = compiled_with(&src, &moved);
            let plan = c.plan.plan();
            let fetched = plan.steps.iter().any(|s| s.op == Op::CopyFromHost);
            assert_eq!(fetched, what.activations(), "{model} {label} {what:?}");
            assert!(plan.host_bytes > 0, "{model} {label}: no host arena");
            let label = format!("{label} {what:?}");
            assert_eq!(plain.0, off.0, "{model} {label}: losses");
            assert!(plain.1 == off.1, "{model} {label}: parameters differ");
        }
    }
}

/// Clipping (and fp16's loss scale) multiply every update by a device scalar: the
/// offloaded plan copies it to the host once and still trains bit for bit as the plain one;
/// so does SGD with momentum (and with gradient accumulation, whose copies run once a step).
#[test]
fn offloaded_updates_read_the_clip_coefficient_and_loss_scale_from_the_host() {
    let src = example("gpt2").replace(
        "weight_decay = 0.1)",
        "weight_decay = 0.1)\n    clip_grad_norm = 0.5",
    );
    assert!(src.contains("clip_grad_norm = 0.5"), "clipping added");
    let sgd = example("gpt2").replace(
        "adamw(lr = 3e-4, betas = (0.9, 0.95), eps = 1e-8, weight_decay = 0.1)",
        "sgd(lr = 0.01, momentum = 0.9)\n    accumulate = 2",
    );
    assert!(sgd.contains("sgd("), "sgd set");
    let runs = [
        (&src, Precision::Fp32),
        (&src, Precision::Fp16),
        (&sgd, Precision::Bf16),
    ];
    for (src, precision) in runs {
        let options = Options {
            overrides: overrides(SMALL_GPT),
            precision: Some(precision),
            ..Options::default()
        };
        let plain = trained(src, &options, 3);
        let off = trained(src, &offloaded(&options), 3);
        assert_eq!(plain.0, off.0, "{precision:?}: losses");
        assert!(plain.1 == off.1, "{precision:?}: parameters differ");
    }
}

/// LLaMA-7B in bf16 with fp32 master weights: the device arena shrinks by exactly the
/// AdamW moments (8 bytes a parameter), which the host arena holds beside one parameter's
/// and one gradient's host copy at a time; each step copies every gradient and parameter
/// to the host (4 + 4 bytes a parameter) and every parameter back (4 bytes).
#[test]
fn llama7b_bf16_offload_moves_exactly_the_optimizer_state_to_the_host() {
    let (plain, off) = bf16_plans("llama7b", Offload::Optimizer);
    let (p, o) = (plain.plan.plan(), off.plan.plan());
    let params = 6_738_415_616u64;
    assert_eq!(p.report.trainable_param_count, params);
    let state = 53_907_324_928u64;
    assert_eq!(p.report.bytes.optimizer, state);
    assert_eq!(o.report.bytes.optimizer, 0);
    assert_eq!(p.arena_bytes - o.arena_bytes, state);
    let host = o.report.host.expect("a host arena");
    assert_eq!(host.optimizer, state);
    assert_eq!(o.host_bytes, host.arena);
    let transfers = o.report.transfers.clone().expect("transfers");
    assert_eq!(
        (transfers.to_host, transfers.to_device),
        (8 * params, 4 * params)
    );
    assert!(o
        .buffers
        .iter()
        .filter(|b| b.class == BufferClass::OptimState)
        .all(|b| b.tier == Tier::Host));
    println!(
        "llama7b bf16: device arena {} plain, {} offloaded; host arena {}; to host {}, to device {}",
        p.arena_bytes, o.arena_bytes, host.arena, transfers.to_host, transfers.to_device
    );
}

/// Bad `--offload` input is a diagnostic with exit 2, never a panic: an unknown word and a
/// model without training.
#[test]
fn offload_refusals_are_diagnostics() {
    let out = common::memc(&["compile", common::MLP, "--offload", "weights"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown offload `weights`"), "{err}");
    let dir = common::scratch("offload_inference");
    let inference = dir.join("infer.mdl");
    std::fs::write(
        &inference,
        "model m {\n  dim N = 4\n  input x: [N, N]\n  param w: [N, N]\n  output y = x @ w\n}\n",
    )
    .unwrap();
    let out = common::memc(&[
        "compile",
        inference.to_str().unwrap(),
        "--offload",
        "optimizer",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--offload applies to training"), "{err}");
}

/// `memc compile --offload optimizer` reports the host arena and the transfers, in the
/// text report, the `--summary` table and the JSON; `train { offload = optimizer }` says
/// the same as the flag.
#[test]
fn the_report_and_summary_state_the_host_arena_and_transfers() {
    let text = common::memc(&["compile", common::MLP, "--offload", "optimizer"]);
    common::assert_success(&text);
    let text = String::from_utf8_lossy(&text.stdout).to_string();
    assert!(
        text.contains("host arena: 3.1 MiB (3,234,088 bytes; optimizer state 1,628,240 bytes"),
        "{text}"
    );
    assert!(
        text.contains(
            "transfers per step: 1.6 MiB device->host, 795.0 KiB host->device (12 copies)"
        ),
        "{text}"
    );
    let summary = common::memc(&[
        "compile",
        common::MLP,
        "--offload",
        "optimizer",
        "--summary",
    ]);
    assert!(String::from_utf8_lossy(&summary.stdout).contains("host arena: 3.1 MiB"));
    let json = common::memc(&[
        "compile",
        common::MLP,
        "--offload",
        "optimizer",
        "--format",
        "json",
    ]);
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["report"]["host"]["optimizer"], 1_628_240);
    assert_eq!(report["report"]["transfers"]["to_device"], 814_120);
    let src = std::fs::read_to_string(common::MLP).unwrap();
    let in_file = src.replace("train {", "train {\n    offload = optimizer");
    assert_ne!(src, in_file);
    let flag = compiled_with(&src, &offloaded(&Options::default()));
    let section = compiled_with(&in_file, &Options::default());
    assert_eq!(flag.plan.plan().report, section.plan.plan().report);
}

/// The extra time of an offloaded step is its copies at the GPU's host link (PCIe 5 on the
/// H100, PCIe 4 on the A100, NVLink-C2C on the GH200) plus its host updates at the stated
/// host bandwidth, less the backward it overlaps; the step's estimate includes it.
#[test]
fn the_cost_model_prices_copies_by_the_host_link_and_updates_by_host_bandwidth() {
    use memc::cost::{estimate, Gpu, HOST_UPDATE_BANDWIDTH, NVLINK_C2C, PCIE4, PCIE5};
    let c = compiled_with(
        &std::fs::read_to_string(common::MLP).unwrap(),
        &offloaded(&Options::default()),
    );
    let plan = c.plan.plan();
    let t = plan.report.transfers.clone().unwrap();
    // AdamW on the host reads parameter, gradient and two moments and writes back three:
    // 28 bytes a parameter.
    let updated = 28 * plan.report.trainable_param_count;
    for (gpu, link) in [
        (Gpu::H100, PCIE5),
        (Gpu::A100, PCIE4),
        (Gpu::Gh200, NVLINK_C2C),
    ] {
        assert_eq!(gpu.spec().host_link, link);
        let e = estimate(plan, gpu);
        let o = e.offload.clone().unwrap();
        let copied = (t.to_host + t.to_device) as f64;
        let issue = t.copies as f64 * memc::cost::LAUNCH_OVERHEAD_S;
        assert_eq!(o.transfer_seconds, copied / link.bandwidth + issue);
        assert_eq!(
            o.host_update_seconds,
            updated as f64 / HOST_UPDATE_BANDWIDTH
        );
        assert_eq!(
            o.extra_seconds,
            (o.transfer_seconds + o.host_update_seconds - o.overlapped_seconds).max(0.0)
        );
        let device = e.compute_bound_seconds + e.memory_bound_seconds + e.launch_seconds;
        assert_eq!(e.seconds, device + o.extra_seconds);
        assert!(e
            .steps
            .iter()
            .all(|s| !matches!(s.op.as_str(), "copy_to_host" | "copy_to_device" | "adamw")));
    }
    assert_eq!(
        t.time.unwrap().gpu,
        Gpu::H100,
        "the report prices it on the H100 without --gpu"
    );
}

/// Whether the row keeps the optimizer state on the host.
fn offloads(row: &memc::advise::Advice) -> bool {
    row.offload.is_some_and(Offload::optimizer)
}

/// With a budget only offload meets while keeping the batch (the MLP's 1,628,240 bytes of
/// AdamW state leave 1,883,396 on the device; nothing else gets under 2,000,000), `memc
/// advise` ranks an offload row first and `memc fit` offloads, having found nothing that
/// fits without it: the optimizer state, which reaches the largest batch (B=92) as both
/// together do, in less estimated time (the activations' copies would add theirs).
#[test]
fn advise_and_fit_pick_offload_where_only_offload_fits() {
    let src = std::fs::read_to_string(common::MLP).unwrap();
    let budget = 2_000_000;
    let rows = memc::advise::advise(&src, &Options::default(), budget);
    assert!(rows[0].offload.is_some() && rows[0].fits, "{:?}", rows[0]);
    assert!(rows[0].note.contains("offload adds"), "{}", rows[0].note);
    let optimizer = rows.iter().find(|r| r.option == "optimizer on the host");
    assert_eq!(optimizer.and_then(|r| r.arena_bytes), Some(1_883_396));
    for r in rows.iter().filter(|r| r.fits && r.keeps_batch) {
        assert!(r.offload.is_some(), "{} fits without offload", r.option);
    }
    let fit = memc::fit::fit_dim(&src, &Options::default(), "B", budget).unwrap();
    let train = fit.plan.plan().train.clone().unwrap();
    assert_eq!(train.offload, Some(Offload::Optimizer));
    let both = Options {
        offload: Some(Offload::All),
        ..Options::default()
    };
    let all = memc::fit::fit_dim(&src, &both, "B", budget).unwrap();
    assert_eq!(all.value, fit.value);
    let time = |f: &memc::fit::FitResult| {
        memc::cost::estimate(f.plan.plan(), memc::cost::Gpu::H100).seconds
    };
    assert!(time(&fit) < time(&all));
    assert!(
        fit.arena_bytes <= budget && fit.value >= 64,
        "{}",
        fit.value
    );
}

/// Where checkpointing fits too and offload costs more (every update after the backward,
/// so no copy overlaps it: 0.5 ms more on the H100 for the small GPT-2, against 0.08 ms of
/// recomputation), a checkpointing row ranks before the rows with the optimizer state on
/// the host, which still fit.
#[test]
fn advise_ranks_checkpointing_first_where_offload_costs_more() {
    let options = Options {
        overrides: overrides(SMALL_GPT),
        optimizer_in_backward: Some(false),
        ..Options::default()
    };
    let rows = memc::advise::advise(&example("gpt2"), &options, 2_600_000);
    assert!(!offloads(&rows[0]), "{:?}", rows[0]);
    let position = |pred: &dyn Fn(&memc::advise::Advice) -> bool| {
        rows.iter().position(|r| r.fits && pred(r)).unwrap()
    };
    let checkpointing = position(&|r| r.option == "selective recomputation");
    let offload = position(&|r| offloads(r));
    assert!(checkpointing < offload, "{rows:#?}");
    let seconds = |i: usize| rows[i].step_seconds.unwrap();
    assert!(seconds(checkpointing) < seconds(offload));
    assert!(rows[checkpointing].extra_compute_percent > 0.0);
}

/// The plan verifier holds each tier to its own arena and every step to one tier (copies
/// aside): a moment moved to the device tier is refused, as is a host arena too small for
/// its buffers, and a copy back to the device run before the update it copies.
#[test]
fn the_verifier_checks_tiers_and_the_copy_after_its_update() {
    let src = std::fs::read_to_string(common::MLP).unwrap();
    let plan = compiled_with(&src, &offloaded(&Options::default()))
        .plan
        .plan()
        .clone();
    let mut moved = plan.clone();
    let state = moved.optim_state[0].buffer;
    moved.buffers[state.index()].tier = Tier::Device;
    common::refused(moved, "mixes device and host buffers");
    let mut small = plan.clone();
    small.host_bytes -= 256;
    common::refused(small, "past the arena size");
    let mut early = plan.clone();
    let back = early
        .steps
        .iter()
        .position(|s| s.op == Op::CopyToDevice)
        .unwrap();
    let update = (0..back)
        .rev()
        .find(|&s| early.steps[s].op.name() == "adamw")
        .unwrap();
    early.steps.swap(update, back);
    common::refused(early, "overwrites");
}

/// An offloaded plan saved as JSON keeps its tiers and runs from the file as compiled.
#[test]
fn a_saved_offloaded_plan_runs_from_its_json() {
    let dir = common::scratch("offload_json");
    let path = dir.join("plan.json");
    let out = common::memc(&[
        "compile",
        common::MLP,
        "--offload",
        "optimizer",
        "--emit",
        "plan",
        "-o",
        path.to_str().unwrap(),
    ]);
    common::assert_success(&out);
    let run = |file: &str, extra: &[&str]| {
        let mut args = vec!["run", file, "--device", "cpu", "--steps", "2"];
        args.extend(extra);
        let out = common::memc(&args);
        common::assert_success(&out);
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let losses = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.contains("loss"))
            .map(str::to_string)
            .collect()
    };
    let saved = run(path.to_str().unwrap(), &[]);
    let plain = run(common::MLP, &[]);
    assert!(!losses(&saved).is_empty(), "{saved}");
    assert_eq!(losses(&saved), losses(&plain));
}

/// `memc compile` (through `compile_or_offload`) offloads only when no plan fits the budget
/// without it (or the offloaded plan is estimated faster), says so, and never for a CUDA
/// target; a budget that a plain plan meets without recomputing gets the plain plan.
#[test]
fn compile_offloads_only_when_nothing_fits_without_it() {
    let src = std::fs::read_to_string(common::MLP).unwrap();
    let at = |budget: u64, target: memc::plan::Target| {
        memc::compile_or_offload(
            &src,
            &Options {
                budget: Some(budget),
                target,
                ..Options::default()
            },
        )
    };
    let cpu = memc::plan::Target::Cpu;
    let (plain, offloaded) = at(8 << 20, cpu).unwrap();
    assert_eq!(offloaded, None);
    assert_eq!(plain.plan.plan().host_bytes, 0);
    let (tight, offloaded) = at(2_000_000, cpu).unwrap();
    assert!(offloaded.is_some());
    let plan = tight.plan.plan();
    assert!(plan.host_bytes > 0 && plan.arena_bytes <= 2_000_000);
    assert!(memc::compile(
        &src,
        &Options {
            budget: Some(2_000_000),
            ..Options::default()
        }
    )
    .is_err());
    assert!(at(2_000_000, memc::plan::Target::CUDA_MIN).is_err());
    let out = common::memc(&["compile", common::MLP, "--budget", "2000000"]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in host memory (--offload "), "{err}");
}

/// GPT-2 small in bf16 at its file dims (B=8, T=1024): every byte backward reads from the
/// forward crosses the link once each way, and the device arena no longer holds the saved
/// activations across the step.
#[test]
fn gpt2_bf16_activations_move_to_the_host_in_exact_bytes() {
    let (plain, off) = bf16_plans("gpt2", Offload::Activations);
    let (p, o) = (plain.plan.plan(), off.plan.plan());
    let saved = p.report.bytes.activations;
    let transfers = o.report.transfers.clone().expect("transfers");
    assert_eq!((transfers.to_host, transfers.to_device), (saved, saved));
    let host = o.report.host.expect("a host arena");
    assert_eq!(o.host_bytes, host.arena);
    assert_eq!(host.optimizer, 0);
    assert!(o
        .buffers
        .iter()
        .filter(|b| b.tier == Tier::Host)
        .all(|b| b.class == BufferClass::Activation));
    println!(
        "gpt2 bf16: device arena {} plain, {} with activations on the host; host arena {}; \
         saved {saved}",
        p.arena_bytes, o.arena_bytes, host.arena
    );
    // 124 copies: 62 saved activations (q, k and v packed as one), each out and back; the
    // host arena is their sum (all live at the end of the forward), the device arena falls
    // by 46%.
    assert_eq!(saved, 1_686_142_976);
    assert_eq!(transfers.copies, 124);
    assert_eq!(host.arena, saved);
    assert_eq!(
        (p.arena_bytes, o.arena_bytes),
        (3_462_000_644, 1_879_251_460)
    );
}

/// The estimate prices the copies by the host link and hides them behind the forward and
/// backward compute they run beside.
#[test]
fn the_cost_model_overlaps_activation_copies_with_compute() {
    let src = example("gpt2");
    let options = Options {
        precision: Some(Precision::Bf16),
        offload: Some(Offload::Activations),
        gpu: Some(memc::cost::Gpu::H100),
        ..Options::default()
    };
    let c = compiled_with(&src, &options);
    let estimate = c.plan.plan().report.estimate.clone().expect("an estimate");
    let offload = estimate.offload.expect("an offload estimate");
    assert!(offload.transfer_seconds > 0.0);
    assert!(offload.overlapped_seconds > 0.0);
    assert_eq!(offload.host_update_seconds, 0.0);
    let want = (offload.transfer_seconds - offload.overlapped_seconds).max(0.0);
    assert!((offload.extra_seconds - want).abs() < 1e-12);
}
