//! Unified memory (`--unified`, `train { unified = true }`): the plan is the plain plan
//! (the budget shapes no checkpointing), and `report.unified` says what of its arena the
//! device holds at the budget's capacity, what is paged to the host, which steps fault
//! under LRU over 2 MiB pages, and the faults' estimated time; nonsense combinations are
//! refused with a diagnostic.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{compiled_with, example, memc, user_error, MLP};
use memc::ir::Phase;
use memc::plan::{Target, Unified, PAGE_BYTES};
use memc::settings::Precision;
use memc::Options;

/// GPT-2 small's bf16 step for the CUDA backend, in unified memory when `unified`.
fn gpt2(budget: Option<u64>, unified: bool) -> memc::Compiled {
    let options = Options {
        precision: Some(Precision::Bf16),
        target: Target::CUDA_MIN,
        budget,
        unified: Some(unified),
        ..Options::default()
    };
    compiled_with(&example("gpt2"), &options)
}

fn unified_of(c: &memc::Compiled) -> &Unified {
    c.plan
        .plan()
        .report
        .unified
        .as_ref()
        .expect("report.unified")
}

/// Steady state under LRU: the device stays full, so each fault evicts one page; the
/// faulting steps' pages sum to the faults; the pages live at the peak are resident or on
/// the host, at least the bytes beyond the device on the host.
fn assert_consistent(u: &Unified) {
    assert_eq!(u.evictions, u.faults);
    assert_eq!(u.faulting.iter().map(|f| f.pages).sum::<u64>(), u.faults);
    assert_eq!(
        (u.to_device, u.to_host),
        (u.faults * PAGE_BYTES, u.evictions * PAGE_BYTES)
    );
    assert!(u.peak_resident + u.peak_on_host >= u.peak_live);
    assert!(u.peak_on_host >= u.peak_over);
    assert!(u.peak_resident <= u.device_pages * PAGE_BYTES);
    // No eviction order faults less than each page beyond the device once.
    assert!(u.optimal_faults <= u.faults);
    assert!(u.optimal_faults >= u.arena_pages.saturating_sub(u.device_pages));
    let link = u.time.gpu.spec().host_link.bandwidth;
    let expected = (u.to_device + u.to_host) as f64 / link + u.faults as f64 * 20e-6;
    assert!(
        (u.time.seconds - expected).abs() < 1e-12,
        "{}",
        u.time.seconds
    );
}

#[test]
fn gpt2_bf16_in_3gib_pages_its_arena_with_exact_figures() {
    let budget = 3u64 << 30;
    let c = gpt2(Some(budget), true);
    let plan = c.plan.plan();
    // The plain plan: what compiling without a budget gives, not the checkpointed plan the
    // budget would give without unified memory.
    let plain = gpt2(None, false);
    assert_eq!(plan.arena_bytes, plain.plan.plan().arena_bytes);
    assert_eq!(plan.arena_bytes, 3_466_323_972);
    assert_eq!(
        gpt2(Some(budget), false).plan.plan().arena_bytes,
        2_560_354_308
    );
    let u = unified_of(&c);
    assert_eq!((u.capacity, u.context_reserve), (budget, 529 << 20));
    assert_eq!((u.device_pages, u.arena_pages), (1_271, 1_653));
    assert_eq!(u.paged_out, 801_112_064);
    assert_eq!((u.peak_step, u.peak_live), (240, 3_466_323_972));
    assert_eq!(
        (u.peak_resident, u.peak_on_host),
        (2_665_480_192, 801_112_064)
    );
    assert_eq!(u.peak_over, 800_843_780);
    assert_eq!((u.faults, u.faulting.len()), (1_085, 48));
    assert_eq!(u.optimal_faults, 437);
    assert_eq!(u.overcommitted_steps, 0);
    let most = u.faulting.iter().max_by_key(|f| f.pages).unwrap();
    assert_eq!(
        (most.step, most.op.as_str(), most.phase),
        (730, "adamw", Phase::Update)
    );
    assert_eq!(most.pages, 220);
    assert_eq!(u.time.link, "PCIe 5.0 x16");
    assert_consistent(u);
    let text = memc::plan::render_text(plan);
    assert!(
        text.contains("leaves 1,271 pages of 2.0 MiB for the arena's 1,653 pages"),
        "{text}"
    );
    assert!(text.contains("1,085 in 48 steps"), "{text}");
    assert!(
        text.contains("step 730 (adamw, update): 220 pages"),
        "{text}"
    );
    assert!(!text.contains("does NOT fit"), "{text}");
}

#[test]
fn an_arena_within_the_gpu_memory_never_faults() {
    // No budget: the capacity is the H100's 80 GiB.
    let c = gpt2(None, true);
    let u = unified_of(&c);
    assert_eq!(u.capacity, 80 << 30);
    assert_eq!((u.paged_out, u.peak_on_host, u.peak_over), (0, 0, 0));
    assert_eq!((u.faults, u.evictions, u.optimal_faults), (0, 0, 0));
    assert!(u.faulting.is_empty());
    assert_eq!(u.peak_resident, u.arena_pages * PAGE_BYTES);
    assert_eq!(u.time.seconds, 0.0);
}

#[test]
fn an_mlp_on_two_pages_faults_in_every_phase_and_gh200_pays_less() {
    let src = std::fs::read_to_string(MLP).unwrap();
    let on = |gpu| Options {
        target: Target::CUDA_MIN,
        unified: Some(true),
        budget: Some(2 * PAGE_BYTES),
        context_reserve: Some(0),
        gpu: Some(gpu),
        ..Options::default()
    };
    let h100 = compiled_with(&src, &on(memc::cost::Gpu::H100));
    let u = unified_of(&h100);
    assert_eq!((u.device_pages, u.arena_pages), (2, 4));
    assert_eq!(u.paged_out, 2 * PAGE_BYTES);
    for phase in [Phase::Forward, Phase::Backward, Phase::Update] {
        assert!(u.faulting.iter().any(|f| f.phase == phase), "{phase:?}");
    }
    assert_consistent(u);
    // The step's estimate on the --gpu includes the faults.
    let estimate = h100.plan.plan().report.estimate.as_ref().unwrap();
    assert_eq!(estimate.page_faults, Some(u.time.seconds));
    assert!(estimate.seconds > u.time.seconds);
    let gh200 = compiled_with(&src, &on(memc::cost::Gpu::Gh200));
    let v = unified_of(&gh200);
    assert_eq!((v.faults, v.time.link.as_str()), (u.faults, "NVLink-C2C"));
    assert!(v.time.seconds < u.time.seconds);
}

/// A device with no page for the arena (the capacity all the CUDA context's) faults every
/// page every step touches, every time it runs: forward and backward once per micro-batch,
/// the update once, so the run order of accumulation shows in the count.
#[test]
fn with_no_page_on_the_device_every_touch_faults_once_per_run() {
    let src = std::fs::read_to_string(MLP).unwrap();
    let options = Options {
        target: Target::CUDA_MIN,
        unified: Some(true),
        budget: Some(1),
        context_reserve: Some(0),
        accumulate: Some(2),
        ..Options::default()
    };
    let c = compiled_with(&src, &options);
    let plan = c.plan.plan();
    let u = unified_of(&c);
    assert_eq!((u.device_pages, u.evictions, u.peak_resident), (0, 0, 0));
    let expected: u64 = (plan.steps.iter())
        .map(|step| {
            let pages = memc::plan::step_pages(plan, step).len() as u64;
            pages * u64::from(plan.runs(step.phase))
        })
        .sum();
    assert_eq!(u.faults, expected);
    assert_eq!(u.optimal_faults, expected);
    assert!(u
        .faulting
        .iter()
        .all(|f| f.pages % u64::from(plan.runs(f.phase)) == 0));
    assert_eq!(plan.runs(Phase::Forward), 2);
    let touching = plan
        .steps
        .iter()
        .filter(|s| !s.inputs.is_empty() || s.output.is_some());
    assert!(u.overcommitted_steps > 0 && u.overcommitted_steps <= touching.count() as u64);
    let text = memc::plan::render_memory_summary(plan);
    assert!(
        text.contains("steps alone touch more pages than the device holds"),
        "{text}"
    );
}

#[test]
fn unified_memory_is_refused_where_it_makes_no_sense() {
    let src = example("gpt2");
    let cuda = Options {
        target: Target::CUDA_MIN,
        unified: Some(true),
        ..Options::default()
    };
    let cases = [
        (
            Options {
                offload: Some(memc::settings::Offload::Activations),
                ..cuda.clone()
            },
            "unified memory does not combine with offloading",
        ),
        (
            Options {
                target: Target::Cpu,
                ..cuda.clone()
            },
            "unified memory is CUDA managed memory, and this plan is for the CPU backend",
        ),
    ];
    for (options, message) in cases {
        let e = user_error(&src, &options);
        assert_eq!(e.message, message);
        assert!(e.span.is_some() && !e.help.is_empty(), "{e:?}");
    }
    let inference =
        "model m {\n  dim N = 4\n  input x: [N, N]\n  param w: [N, N]\n  output y = x @ w\n}\n";
    let e = user_error(inference, &cuda);
    assert!(e.message.contains("--unified applies to training"), "{e:?}");
}

#[test]
fn the_cli_reports_unified_memory_in_json_and_refuses_it_with_exit_2() {
    let budget = (2 * PAGE_BYTES).to_string();
    let args = [
        "compile",
        MLP,
        "--device",
        "cuda",
        "--unified",
        "--budget",
        &budget,
    ];
    let out = memc(&[&args[..], &["--context-reserve", "0", "--format", "json"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let u = &report["report"]["unified"];
    assert_eq!(u["device_pages"], 2);
    assert_eq!(u["arena_pages"], 4);
    assert_eq!(u["faults"], u["evictions"]);
    for args in [
        &["check", MLP, "--unified"][..],
        &[
            "check",
            MLP,
            "--unified",
            "--device",
            "cuda",
            "--offload",
            "optimizer",
        ],
        &[
            "fit",
            MLP,
            "--unified",
            "--device",
            "cuda",
            "--budget",
            "1GiB",
        ],
        &[
            "compile",
            "examples/unet3d_tileable.mdl",
            "--tile",
            "S=auto",
            "--unified",
            "--device",
            "cuda",
            "--budget",
            "1GiB",
        ],
    ] {
        let out = memc(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("unified"), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

#[test]
fn advise_on_cuda_adds_a_unified_row_that_fits_by_paging() {
    let src = std::fs::read_to_string(MLP).unwrap();
    let options = Options {
        target: Target::CUDA_MIN,
        context_reserve: Some(0),
        ..Options::default()
    };
    let rows = memc::advise::advise(&src, &options, 2 * PAGE_BYTES);
    let row = rows
        .iter()
        .find(|r| r.option == "unified memory")
        .expect("unified row");
    assert!(row.fits);
    assert_eq!(row.arena_bytes, Some(7_706_372));
    assert!(
        row.flags.join(" ").starts_with("--unified --budget"),
        "{row:?}"
    );
    assert!(row.note.contains("page faults adding"), "{row:?}");
    let cpu = memc::advise::advise(&src, &Options::default(), 2 * PAGE_BYTES);
    assert!(cpu.iter().all(|r| r.option != "unified memory"));
}
