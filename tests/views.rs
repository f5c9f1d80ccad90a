//! Reshapes are views: the output buffer sits at its input's bytes, its step launches no
//! kernel, the input lives as long as the view, and the verifier refuses a view that is
//! moved, outlives its root or is output by anything but a reshape; a cast group's members
//! are views of ranges of its bytes, one after another.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use common::{compiled, executor, loss, refused};
use memc::ir::Op;
use memc::plan::Plan;

const SRC: &str = "model views {\n  dim B = 4, C = 3, H = 8\n  input x: [B, C, H]\n  param w: [C * H, 5] = normal(0.5)\n  let h = tanh(x * 2.0)\n  let f = reshape(h, (B, C * H))\n  loss = sum(f @ w)\n  train { optimizer = sgd(lr = 0.1) }\n}\n";

fn plan() -> Plan {
    compiled(SRC).plan.plan().clone()
}

/// The forward reshape step and its output buffer's index.
fn reshape_step(plan: &Plan) -> usize {
    plan.steps
        .iter()
        .position(|s| matches!(s.op, Op::Reshape { .. }) && s.phase == memc::ir::Phase::Forward)
        .expect("a forward reshape")
}

#[test]
fn a_reshape_shares_its_input_bytes_and_launches_nothing() {
    let plan = plan();
    let s = reshape_step(&plan);
    let step = &plan.steps[s];
    let (root, view) = (
        &plan.buffers[step.inputs[0].index()],
        &plan.buffers[step.output.unwrap().index()],
    );
    assert_eq!(view.view_of, Some(root.id));
    assert_eq!((view.offset, view.bytes), (root.offset, root.bytes));
    assert!(root.first <= view.first && view.last <= root.last);
    assert!(!plan.launches(step));
    // The matmul's weight gradient reads the view after the forward pass: the root is kept
    // to that step, and its bytes are counted once.
    assert!(root.last > s);
    let no_reuse: u64 = plan
        .buffers
        .iter()
        .filter(|b| b.view_of.is_none())
        .map(|b| b.bytes)
        .sum();
    assert_eq!(plan.report.bytes.no_reuse, no_reuse);
    assert_eq!(plan.report.bytes.activations, 4 * 3 * 8 * 4);
}

#[test]
fn sgd_through_a_view_lowers_the_loss() {
    let c = compiled(SRC);
    let mut ex = executor(&c, 3);
    let first = loss(&mut ex);
    let second = loss(&mut ex);
    assert!(first.is_finite() && second.is_finite());
    assert!(
        second < first,
        "sgd on sum(f @ w) lowers the loss: {first} -> {second}"
    );
}

#[test]
fn a_moved_view_is_refused() {
    let mut plan = plan();
    let s = reshape_step(&plan);
    let view = plan.steps[s].output.unwrap();
    plan.buffers[view.index()].offset += 256;
    plan.arena_bytes += 256;
    refused(plan, "does not sit at the bytes of its root");
}

#[test]
fn a_view_output_by_a_kernel_is_refused() {
    let mut plan = plan();
    // Make the tanh's output a view of the affine's: a tanh is not a reshape.
    let s = plan
        .steps
        .iter()
        .position(|s| matches!(s.op, Op::Unary(_)))
        .unwrap();
    let (input, output) = (plan.steps[s].inputs[0], plan.steps[s].output.unwrap());
    plan.buffers[output.index()].view_of = Some(input);
    plan.buffers[output.index()].offset = plan.buffers[input.index()].offset;
    refused(plan, "outputs a view but is not a reshape");
}

/// A bf16 GPT-2 for CUDA small enough to test, whose weights and biases fill whole 256-byte
/// blocks in bf16, so each layer's parameter casts are one group.
fn grouped_plan() -> Plan {
    let options = memc::Options {
        overrides: common::overrides(&[("L", 2), ("D", 128), ("T", 16), ("V", 64), ("H", 4)]),
        precision: Some(memc::settings::Precision::Bf16),
        target: memc::plan::Target::CUDA_MIN,
        ..memc::Options::default()
    };
    let c = common::compiled_with(&common::example("gpt2"), &options);
    c.plan.plan().clone()
}

/// The members of the first cast group: (step index, buffer index) each.
fn members(plan: &Plan) -> (usize, Vec<(usize, usize)>) {
    let group = plan
        .steps
        .iter()
        .position(|s| matches!(s.op, Op::CastGroup { .. }));
    let group = group.expect("a cast group");
    let packed = plan.steps[group].output.expect("the packed output");
    let members = (plan.steps.iter().enumerate())
        .filter(|(_, s)| matches!(s.op, Op::Member { .. }) && s.inputs == [packed])
        .map(|(i, s)| (i, s.output.expect("a member's output").index()))
        .collect();
    (packed.index(), members)
}

#[test]
fn cast_group_members_sit_one_after_another_in_its_bytes_and_launch_nothing() {
    let plan = grouped_plan();
    let (packed, members) = members(&plan);
    assert_eq!(members.len(), 8, "four weights and four biases");
    let root = &plan.buffers[packed];
    let mut at = 0;
    for &(s, b) in &members {
        let m = &plan.buffers[b];
        assert!(!plan.launches(&plan.steps[s]));
        assert_eq!(m.view_of, Some(root.id));
        assert_eq!((m.view_offset, m.offset), (at, root.offset + at));
        assert_eq!(m.offset % 256, 0);
        at += m.bytes;
    }
    assert_eq!(at, root.bytes);
}

#[test]
fn a_member_off_its_place_is_refused() {
    let mut plan = grouped_plan();
    let (_, members) = members(&plan);
    let b = members[1].1;
    plan.buffers[b].offset += 256;
    refused(plan.clone(), "does not sit at the bytes of its root");
    plan.buffers[b].view_offset += 256;
    refused(plan, "is not a reshape or member of its root");
}
