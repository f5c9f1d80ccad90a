//! What backward reads: where a backward rule offers another form of a node (a unary
//! derivative from the output instead of the input), the plan reads whichever forward value
//! another backward node keeps already, and saves fewer bytes.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use common::{compiled, compiled_with, example};
use memc::budget::CheckpointMode;
use memc::ir::{Op, UnaryFn};
use memc::Options;

fn unary_backward_forms(src: &str) -> (usize, usize) {
    let c = compiled(src);
    let steps = &c.plan.plan().steps;
    let from_input = steps
        .iter()
        .filter(|s| matches!(s.op, Op::UnaryBackward(_)))
        .count();
    let from_output = steps
        .iter()
        .filter(|s| matches!(s.op, Op::UnaryOutputBackward(_)))
        .count();
    (from_input, from_output)
}

#[test]
fn relu_backward_reads_the_output_the_next_matmul_keeps() {
    let src = example("mlp");
    assert_eq!(unary_backward_forms(&src), (0, 1));
    // h = relu(images @ fc1 + b) is read by fc2's weight gradient; the pre-activation is no
    // longer saved. Saved: h (64 x 256 x 4 B) and the logits cross-entropy reads (64 x 10 x 4 B).
    let c = compiled(&src);
    assert_eq!(
        c.plan.plan().report.bytes.activations,
        64 * 256 * 4 + 64 * 10 * 4
    );
}

#[test]
fn the_input_form_stays_where_the_input_is_kept_anyway() {
    // relu(x) of a parameter: the parameter is kept anyway, so reading it saves nothing and
    // reading the output would add a saved value.
    let src = "model m {\n  dim A = 3, B = 4\n  param x: [A, B] = normal(1.0)\n  param w: [A, B] = normal(1.0)\n  loss = sum(relu(x) + w)\n  train { optimizer = sgd(lr = 0.1) }\n}\n";
    assert_eq!(unary_backward_forms(src), (1, 0));
}

#[test]
fn sixteen_bit_outputs_offer_only_the_exact_form() {
    // A bf16 tanh output is rounded, so its derivative is taken from the input; relu's is
    // exact in any precision.
    let body = |f: &str| {
        format!(
            "model m {{\n  dim B = 8, D = 16\n  input x: [B, D]\n  param w1: [D, D] = normal(0.1)\n  param w2: [D, D] = normal(0.1)\n  let h = {f}(x @ w1)\n  loss = sum(h @ w2)\n  train {{ optimizer = sgd(lr = 0.1)  precision = bf16 }}\n}}\n"
        )
    };
    assert_eq!(unary_backward_forms(&body("relu")), (0, 1));
    let (from_input, from_output) = unary_backward_forms(&body("tanh"));
    assert_eq!(from_output, 0);
    assert!(from_input >= 1);
    let fp32 = body("tanh").replace("precision = bf16", "precision = fp32");
    assert_eq!(unary_backward_forms(&fp32), (0, 1));
}

#[test]
fn resnet18_relus_read_what_the_next_layer_keeps() {
    // Keep-all, so that no batch norm or relu is recomputed (the default plan recomputes
    // each from its convolution's output).
    let options = Options {
        checkpoint: CheckpointMode::KeepAll,
        ..Options::default()
    };
    let c = compiled_with(&example("resnet18"), &options);
    let relu_from_input = c
        .plan
        .plan()
        .steps
        .iter()
        .filter(|s| s.op == Op::UnaryBackward(UnaryFn::Relu))
        .count();
    let relu_from_output = c
        .plan
        .plan()
        .steps
        .iter()
        .filter(|s| s.op == Op::UnaryOutputBackward(UnaryFn::Relu))
        .count();
    // Every relu but the last reads its output, which the next convolution or max-pool keeps;
    // the last one's output feeds the average pool, whose backward reads nothing, so it keeps
    // its input form (the same bytes either way).
    assert_eq!((relu_from_input, relu_from_output), (1, 16));
    assert_eq!(c.plan.plan().report.bytes.activations, 159_808_768);
}
