//! The plan verifier refuses tampered plans: each case edits the plan compiled from
//! `examples/mlp.mdl`, checks `memc::plan::verify` names the broken step or buffer, and for
//! some runs the edited JSON through `memc run`, which must exit 2 with that message.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use common::refused;
use memc::plan::{verify, BufferId, Plan};
use memc::Options;
use std::process::Command;

const MLP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/mlp.mdl");
const ALIGN: u64 = 256;

/// The verified plan of the MLP with batch 4, accumulating `accumulate` micro-batches.
fn mlp(accumulate: Option<u32>) -> Plan {
    let src = std::fs::read_to_string(MLP).unwrap();
    let options = Options {
        overrides: vec![("B".to_string(), 4)],
        accumulate,
        ..Options::default()
    };
    match memc::compile(&src, &options) {
        Ok(c) => c.plan.plan().clone(),
        Err(e) => panic!("mlp does not compile: {e:?}"),
    }
}

/// `memc run` on `plan` written as JSON: it must exit 2 and say `needle`.
fn run_refuses(name: &str, plan: &Plan, needle: &str) {
    let dir = std::env::temp_dir().join(format!("memc-verify-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tampered.json");
    std::fs::write(&path, serde_json::to_string(plan).unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_memc"))
        .arg("run")
        .arg(&path)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("fails plan verification"), "{stderr}");
    assert!(stderr.contains(needle), "no `{needle}` in {stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The step label the verifier uses: `step 3 (relu)`.
fn label(plan: &Plan, s: usize) -> String {
    format!("step {s} ({})", plan.steps[s].op.name())
}

/// Whether a buffer is written at load (parameter, optimizer state or input).
fn loaded(plan: &Plan, b: BufferId) -> bool {
    plan.params.iter().any(|p| p.buffer == b)
        || plan.optim_state.iter().any(|s| s.buffer == b)
        || plan.inputs.iter().any(|i| i.buffer == b)
}

/// A free, aligned offset past every buffer, growing the arena to hold `bytes` there (plus
/// `skew` bytes of misalignment).
fn fresh_offset(plan: &mut Plan, bytes: u64, skew: u64) -> u64 {
    let offset = plan.arena_bytes.div_ceil(ALIGN) * ALIGN + skew;
    plan.arena_bytes = offset + bytes;
    offset
}

/// Makes one step read its own output in place of an input of the same type (the CPU
/// executor would hand the kernel overlapping slices); returns the step.
fn self_read(plan: &mut Plan) -> usize {
    let (s, i) = plan
        .steps
        .iter()
        .enumerate()
        .find_map(|(s, step)| {
            let out = &plan.buffers[step.output?.index()].ty;
            let i = step
                .inputs
                .iter()
                .position(|b| plan.buffers[b.index()].ty == *out)?;
            Some((s, i))
        })
        .unwrap();
    plan.steps[s].inputs[i] = plan.steps[s].output.unwrap();
    s
}

/// Moves one buffer to an offset that is not a multiple of the target's alignment and says
/// in the plan's own `alignment` field that this is fine; returns the buffer.
fn misalign(plan: &mut Plan) -> BufferId {
    let b = plan.steps[0].output.unwrap();
    let bytes = plan.buffers[b.index()].bytes;
    plan.buffers[b.index()].offset = fresh_offset(plan, bytes, 64);
    plan.alignment = 64;
    b
}

/// The verifier's message for buffer `b` placed off the target's 256-byte alignment.
fn misaligned_message(plan: &Plan, b: BufferId) -> String {
    format!(
        "{b} `{}` at offset {} is not a multiple of the alignment 256",
        plan.buffers[b.index()].name,
        plan.buffers[b.index()].offset
    )
}

#[test]
fn a_step_reading_its_own_output_is_refused() {
    let mut plan = mlp(None);
    let s = self_read(&mut plan);
    refused(
        plan,
        &format!("{} reads its own output", label(&mlp(None), s)),
    );
}

#[test]
fn memc_run_refuses_a_step_reading_its_own_output() {
    let mut plan = mlp(None);
    let s = self_read(&mut plan);
    let needle = format!("{} reads its own output", label(&plan, s));
    run_refuses("self-read", &plan, &needle);
}

#[test]
fn a_buffer_read_before_any_step_writes_it_is_refused() {
    let mut plan = mlp(None);
    let (s, i) = plan
        .steps
        .iter()
        .enumerate()
        .find_map(|(s, step)| {
            let i = step.inputs.iter().position(|&b| !loaded(&plan, b))?;
            Some((s, i))
        })
        .unwrap();
    // A copy of the input at fresh bytes, live over the whole step, that no step writes.
    let mut copy = plan.buffers[plan.steps[s].inputs[i].index()].clone();
    copy.id = BufferId(plan.buffers.len() as u32);
    copy.offset = fresh_offset(&mut plan, copy.bytes, 0);
    copy.first = 0;
    copy.last = plan.steps.len() - 1;
    plan.steps[s].inputs[i] = copy.id;
    let needle = format!(
        "{} reads {} `{}` before any step writes it",
        label(&plan, s),
        copy.id,
        copy.name
    );
    plan.buffers.push(copy);
    let errors = refused(plan, &needle);
    assert_eq!(errors.len(), 1, "{errors:#?}");
}

#[test]
fn a_step_whose_output_shares_bytes_with_an_input_is_refused() {
    let mut plan = mlp(None);
    let s = plan
        .steps
        .iter()
        .position(|step| step.output.is_some() && !step.inputs.is_empty())
        .unwrap();
    let (input, output) = (plan.steps[s].inputs[0], plan.steps[s].output.unwrap());
    plan.buffers[output.index()].offset = plan.buffers[input.index()].offset;
    let needle = format!(
        "{}: its input 0 {input} `{}` and its output {output} `{}` share arena bytes",
        label(&plan, s),
        plan.buffers[input.index()].name,
        plan.buffers[output.index()].name
    );
    refused(plan, &needle);
}

#[test]
fn an_update_naming_one_buffer_for_two_in_place_inputs_is_refused() {
    let mut plan = mlp(None);
    let s = plan
        .steps
        .iter()
        .position(|step| step.op.name() == "adamw")
        .unwrap();
    // The parameter stands in for its first moment: both are overwritten in place.
    let param = plan.steps[s].inputs[0];
    plan.steps[s].inputs[2] = param;
    let needle = format!(
        "{} uses {param} `{}` as its input 0 and its input 2",
        label(&plan, s),
        plan.buffers[param.index()].name
    );
    refused(plan, &needle);
}

#[test]
fn a_misaligned_offset_is_refused_whatever_the_plan_says_its_alignment_is() {
    let mut plan = mlp(None);
    let b = misalign(&mut plan);
    let needle = misaligned_message(&plan, b);
    let errors = refused(plan, &needle);
    assert!(
        errors.iter().any(|e| e.contains("states alignment 64")),
        "{errors:#?}"
    );
}

#[test]
fn memc_run_refuses_a_misaligned_offset() {
    let mut plan = mlp(None);
    let b = misalign(&mut plan);
    let needle = misaligned_message(&plan, b);
    run_refuses("misaligned", &plan, &needle);
}

#[test]
fn an_in_place_writer_out_of_phase_order_is_refused() {
    // Relabelled as an update, the accumulation would run once per step, after the last
    // micro-batch and after the update that reads its accumulator.
    let mut plan = mlp(Some(2));
    let w = plan
        .steps
        .iter()
        .position(|step| step.op.name() == "accumulate_grad")
        .unwrap();
    plan.steps[w].phase = memc::ir::Phase::Update;
    let acc = plan.steps[w].inputs[0];
    let r = plan
        .steps
        .iter()
        .position(|step| {
            matches!(step.op.name(), "adamw" | "adamw_group") && step.inputs.contains(&acc)
        })
        .unwrap();
    assert!(r > w);
    let needle = format!(
        "{} overwrites {acc} `{}` in place before {}, which reads it in the update phase",
        label(&plan, w),
        plan.buffers[acc.index()].name,
        label(&plan, r)
    );
    let errors = refused(plan, &needle);
    assert_eq!(errors.len(), 1, "{errors:#?}");
}

#[test]
fn an_update_reading_before_an_earlier_phase_writer_is_refused() {
    // An update moved into the forward phase must run before every backward reader of the
    // parameter it overwrites; the schedule puts it after them.
    let mut plan = mlp(None);
    let read_in_backward = |b: BufferId| {
        plan.steps
            .iter()
            .any(|s| s.phase == memc::ir::Phase::Backward && s.inputs.contains(&b))
    };
    let w = plan
        .steps
        .iter()
        .position(|step| step.op.name() == "adamw" && read_in_backward(step.inputs[0]))
        .unwrap();
    let param = plan.steps[w].inputs[0];
    let needle = format!(
        "reads {param} `{}` in the backward phase before step {w} (adamw) overwrites it in place in the forward phase",
        plan.buffers[param.index()].name
    );
    plan.steps[w].phase = memc::ir::Phase::Forward;
    refused(plan, &needle);
}

#[test]
fn every_buffer_id_the_plan_binds_is_below_the_buffer_count() {
    // The verifier once ended with a comparison of the buffer count with itself; what it
    // stands for is that every id the plan names, bindings included, is in the list.
    let mut plan = mlp(None);
    let missing = BufferId(plan.buffers.len() as u32);
    let loss = plan.outputs.iter().position(|(n, _)| n == "loss").unwrap();
    plan.outputs[loss].1 = missing;
    refused(
        plan,
        &format!("output `loss` names missing buffer {missing}"),
    );
    let mut plan = mlp(None);
    plan.params[0].buffer = missing;
    refused(plan, &format!("names missing buffer {missing}"));
}

#[test]
fn the_compiled_plans_verify_after_a_json_round_trip() {
    for accumulate in [None, Some(2)] {
        let plan = mlp(accumulate);
        let json = serde_json::to_string(&plan).unwrap();
        let back: Plan = serde_json::from_str(&json).unwrap();
        assert!(verify(back).is_ok());
    }
}

/// An input the step also returns keeps its bytes to the end of the step: its storage is not
/// reused by the values computed after its last reader, so the output reads back the input.
#[test]
fn an_input_returned_as_an_output_lives_to_the_end() {
    let src = "model io {
  input x: [64, 64]
  param w: [64, 64] = normal(0.1)
  let a = x @ w
  let b = relu(a) @ w
  let c = b @ w
  output y = x
  output z = c
}";
    let compiled = match memc::compile(src, &Options::default()) {
        Ok(c) => c,
        Err(e) => panic!("io does not compile: {e:?}"),
    };
    let plan = compiled.plan.plan();
    let x = plan.inputs[0].buffer;
    let last = plan.steps.len() - 1;
    assert_eq!(plan.buffers[x.index()].last, last);
    let mut ex = memc::exec::cpu::CpuExecutor::new(&compiled.plan).unwrap();
    ex.init_params(7).unwrap();
    let data: Vec<f32> = (0..64 * 64).map(|i| i as f32 / 100.0).collect();
    ex.bind_input(x, data.clone()).unwrap();
    ex.run_step(None).unwrap();
    assert_eq!(ex.output("y").unwrap().into_owned(), data);
}
