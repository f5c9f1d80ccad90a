//! Packed attention trains exactly as separate q, k and v do on the CPU backend: a small
//! GPT-2 block whose q, k and v split one projection (packed by the pass) against the same
//! block with q passed through `* 1.0` first (an exact identity that keeps the pass away),
//! fp32, causal and not: the same losses and every gradient bit for bit.

// The shared helpers unwrap and panic on a failed compile or step.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use std::collections::HashMap;

/// One attention block over `x @ qkv` split three ways; `q_through` wraps q.
fn block(q_through: &str, causal: bool) -> String {
    format!(
        "model packed {{
  dim B = 2, T = 6, D = 16, H = 2
  input x: [B, T, D]
  param ln: layernorm(D)
  param qkv: linear(D, 3*D)
  param proj: [D, D] = normal(0.5)
  let q, k, v = split(linear(layernorm(x, ln), qkv), 3, axis = -1)
  let y = attention({q_through}, k, v, heads = H, causal = {causal}) @ proj
  loss = mean(y * y)
  train {{ optimizer = sgd(lr = 0.1) }}
}}
"
    )
}

/// The plan's op names, the losses of three steps and the gradients of the first, as bits.
fn run(src: &str) -> (Vec<&'static str>, Vec<u32>, HashMap<String, Vec<u32>>) {
    let c = common::compiled(src);
    let ops = c.plan.plan().steps.iter().map(|s| s.op.name()).collect();
    let mut ex = common::executor(&c, 11);
    let mut grads = HashMap::new();
    ex.run_step(Some(&mut |name: &str, g: &[f32]| {
        grads.insert(name.to_string(), g.iter().map(|v| v.to_bits()).collect());
    }))
    .expect("step");
    let losses = (0..3).map(|_| common::loss(&mut ex).to_bits()).collect();
    (ops, losses, grads)
}

#[test]
fn packed_attention_trains_bit_for_bit_as_separate_operands() {
    for causal in [true, false] {
        let (packed_ops, packed_losses, packed_grads) = run(&block("q", causal));
        let (plain_ops, plain_losses, plain_grads) = run(&block("q * 1.0", causal));
        let count = |ops: &[&str], op| ops.iter().filter(|&&o| o == op).count();
        assert_eq!(count(&packed_ops, "packed_attention"), 1);
        assert_eq!(count(&packed_ops, "packed_attention_backward"), 1);
        assert_eq!(count(&plain_ops, "packed_attention"), 0);
        assert_eq!(count(&plain_ops, "attention_backward"), 3);
        assert_eq!(packed_losses, plain_losses, "causal {causal}");
        assert_eq!(packed_grads.len(), 5, "ln and qkv (two each), proj");
        assert_eq!(packed_grads, plain_grads, "causal {causal}");
    }
}
