//! A plan for a GPU counts the CUDA context beside its arena: `report.device` holds the arena,
//! the stated reserve (or `--context-reserve`) and their sum, `--budget` holds the sum, and
//! the CPU's plans carry none.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{compiled_with, example, memc, tiny_gpt};
use memc::plan::Target;
use memc::Options;

const RESERVE: u64 = 529 << 20;

fn gpt2(target: Target, budget: Option<u64>, context_reserve: Option<u64>) -> memc::Compiled {
    compiled_with(
        &example("gpt2"),
        &Options {
            overrides: tiny_gpt(4),
            target,
            budget,
            context_reserve,
            ..Options::default()
        },
    )
}

#[test]
fn a_gpu_plan_reports_its_arena_and_the_context_reserve() {
    let plan = gpt2(Target::CUDA_MIN, None, None);
    let p = plan.plan.plan();
    let d = p.report.device.expect("a GPU plan has device bytes");
    assert_eq!(d.arena, p.arena_bytes);
    assert_eq!(d.context_reserve, RESERVE);
    assert_eq!(d.total, p.arena_bytes + RESERVE);
    assert_eq!(p.report.budgeted_bytes(), d.total);
    let cpu = gpt2(Target::Cpu, None, None);
    assert_eq!(cpu.plan.plan().report.device, None);
    assert_eq!(
        cpu.plan.plan().report.budgeted_bytes(),
        cpu.plan.plan().arena_bytes
    );
}

/// The same budget leaves the GPU plan's arena the budget less the reserve: with the reserve
/// the plan recomputes to fit, with none it keeps everything.
#[test]
fn the_budget_holds_the_arena_and_the_reserve_together() {
    let keep_all = gpt2(Target::CUDA_MIN, None, Some(0))
        .plan
        .plan()
        .arena_bytes;
    let budget = RESERVE + keep_all - 1;
    let fitted = gpt2(Target::CUDA_MIN, Some(budget), None);
    let d = fitted.plan.plan().report.device.unwrap();
    assert!(d.total <= budget, "{} > {budget}", d.total);
    assert!(d.arena < keep_all);
    let roomy = gpt2(Target::CUDA_MIN, Some(budget), Some(0));
    assert_eq!(roomy.plan.plan().arena_bytes, keep_all);
}

#[test]
fn the_cli_names_the_reserve_when_nothing_fits() {
    let gpt2 = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/gpt2.mdl");
    let out = memc(&["compile", gpt2, "--device", "cuda", "--budget", "600MiB"]);
    assert_eq!(out.status.code(), Some(2));
    // The diagnostic wraps its lines: compare its words.
    let err = String::from_utf8_lossy(&out.stderr).replace('│', " ");
    let words = err.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        words.contains("beside the CUDA context's 529.0 MiB"),
        "{err}"
    );
    let text = memc(&[
        "compile",
        gpt2,
        "--device",
        "cuda",
        "--context-reserve",
        "1GiB",
    ]);
    let report = String::from_utf8_lossy(&text.stdout);
    assert!(
        report.contains("with the CUDA context's 1.0 GiB"),
        "{report}"
    );
}

/// The CUDA backend refuses a plan built for the CPU (its scratch buffers are the CPU
/// kernels' sizes, smaller than attention's CUDA workspace), and `memc emit` plans for CUDA
/// whatever `--device` says: its `device.json` arena is `compile --device cuda`'s.
#[test]
fn cuda_takes_only_plans_built_for_it_and_emit_builds_one() {
    let cpu = gpt2(Target::Cpu, None, None);
    let cuda = gpt2(Target::CUDA_MIN, None, None);
    let refused = memc::exec::cuda_can_run(cpu.plan.plan(), true).unwrap_err();
    assert!(refused.to_string().contains("--device cuda"), "{refused}");
    memc::exec::cuda_can_run(cuda.plan.plan(), true).unwrap();
    assert_ne!(
        cpu.plan.plan().arena_bytes,
        cuda.plan.plan().arena_bytes,
        "the test needs a model whose scratch differs between the targets"
    );
    let dir = common::scratch("emit_target");
    let mut args = vec!["emit", "examples/gpt2.mdl", "-o", dir.to_str().unwrap()];
    let dims: Vec<String> = tiny_gpt(4)
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for d in &dims {
        args.extend(["--set", d]);
    }
    let out = memc(&args);
    common::assert_success(&out);
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("plan.json")).unwrap()).unwrap();
    assert_eq!(
        plan["arena_bytes"].as_u64(),
        Some(cuda.plan.plan().arena_bytes),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
