//! Reshapes are views: the output buffer sits at its input's bytes, its step launches no
//! kernel, the input lives as long as the view, and the verifier refuses a view that is
//! moved, outlives its root or is output by anything but a reshape.
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
