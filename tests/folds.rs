//! The compiler's launch-saving folds on a mixed-precision GPT-2 step, asserted on the plan
//! (their values are checked where the gradients are: against PyTorch in `precision.rs`,
//! by finite differences in `gradcheck.rs`): a bias is added in its matmul's epilogue, a
//! bias gradient is one fp32 `sum_to`, a layer norm read only as bf16 stores bf16, attention
//! reads q, k and v packed in the qkv product and writes their gradient in one op, a block's
//! AdamW steps are one group, and the fused loss head takes at most 16 chunks (the grouped
//! updates train bit for bit as single ones: `offload.rs`, whose offloaded updates are not
//! grouped).
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use memc::ir::{DType, Op};
use memc::settings::Precision;
use memc::Options;

#[test]
fn a_bf16_gpt2_step_folds_biases_casts_pads_and_chunks() {
    let options = Options {
        precision: Some(Precision::Bf16),
        ..Options::default()
    };
    let c = common::compiled_with(&common::example("gpt2"), &options);
    let plan = c.plan.plan();
    let dtype = |b: &memc::plan::BufferId| plan.buffers[b.index()].ty.dtype;
    let producer = |b: &memc::plan::BufferId| {
        plan.steps
            .iter()
            .find(|s| s.output.as_ref() == Some(b))
            .map(|s| &s.op)
    };
    let layers = 12;
    let count = |f: &dyn Fn(&memc::plan::Step) -> bool| plan.steps.iter().filter(|s| f(s)).count();
    // Attention reads q, k and v from the qkv product, and one backward op writes its
    // gradient: no zero-padded slices, no concat, no separate backward per operand.
    assert_eq!(count(&|s| matches!(s.op, Op::PadSlice { .. })), 0);
    assert_eq!(count(&|s| matches!(s.op, Op::Concat { .. })), 0);
    assert_eq!(count(&|s| matches!(s.op, Op::PackedAttention(_))), layers);
    let packed_backward = count(&|s| matches!(s.op, Op::PackedAttentionBackward(_)));
    assert_eq!(packed_backward, layers);
    assert_eq!(count(&|s| matches!(s.op, Op::AttentionBackward { .. })), 0);
    // Bias gradients: fp32 sums, and no cast reads a sum.
    let wide_sums = count(&|s| {
        matches!(s.op, Op::SumTo { f32_out: true, .. })
            && s.output.as_ref().map(dtype) == Some(DType::F32)
    });
    assert_eq!(wide_sums, 4 * layers, "qkv, proj, fc and fc_proj biases");
    let cast_of = |s: &memc::plan::Step, what: fn(&Op) -> bool| {
        matches!(s.op, Op::Cast { .. }) && s.inputs.first().and_then(producer).is_some_and(what)
    };
    assert_eq!(
        count(&|s| cast_of(s, |op| matches!(op, Op::SumTo { .. }))),
        0
    );
    // Layer norms (two a layer and the final one) store bf16 themselves, in forward and in
    // their recomputation for backward; no cast reads a norm.
    let narrow = count(&|s| {
        matches!(
            s.op,
            Op::Norm {
                store: Some(DType::BF16),
                ..
            }
        )
    });
    assert_eq!(narrow, 2 * (2 * layers + 1));
    assert_eq!(
        count(&|s| cast_of(s, |op| matches!(op, Op::Norm { .. }))),
        0
    );
    // The optimizer runs in backward: each large weight (4 a layer, the two embeddings) is
    // stepped as its gradient completes; the small parameters (biases, norm scales) of each
    // block instance and of the top level are one group each.
    let single = count(&|s| matches!(s.op, Op::AdamW(_)));
    assert_eq!(single, 4 * layers + 2);
    let groups: Vec<u32> = (plan.steps.iter())
        .filter_map(|s| match s.op {
            Op::AdamWGroup { tensors, .. } => Some(tensors),
            _ => None,
        })
        .collect();
    assert_eq!(groups.len(), layers + 1);
    assert_eq!(
        groups.iter().sum::<u32>() as usize,
        plan.params.len() - single
    );
    // Biases are cuBLASLt epilogues: every forward linear is one matmul with its bias, and
    // no add reads a product.
    assert_eq!(
        count(&|s| matches!(s.op, Op::MatMul { bias: true, .. })),
        4 * layers
    );
    let add_of_product = |s: &memc::plan::Step| {
        matches!(s.op, Op::Binary(memc::ir::BinaryFn::Add))
            && (s.inputs.iter()).any(|b| matches!(producer(b), Some(Op::MatMul { .. })))
    };
    assert_eq!(count(&add_of_product), 0);
    // A layer norm's bias gradient is a sum over rows; no q/k/v slice is copied, the qkv
    // product itself is saved for backward.
    assert_eq!(count(&|s| matches!(s.op, Op::NormBackwardBias { .. })), 0);
    assert_eq!(count(&|s| matches!(s.op, Op::Slice { .. })), 0);
    // The loss head: 8 x 1024 rows in 16 chunks of 512.
    for s in &plan.steps {
        if let Op::LinearCrossEntropy(lce) | Op::LinearCrossEntropyBackward { lce, .. } = &s.op {
            assert_eq!(lce.chunk, 512);
        }
    }
}

/// Updating after backward, every gradient is live until the updates anyway: each block
/// instance's parameters, large weights too, are one AdamW group, and the step needs the
/// 3,462,000,644 bytes the ungrouped updates' plan needed.
#[test]
fn updates_after_backward_group_each_scope() {
    let options = Options {
        precision: Some(Precision::Bf16),
        optimizer_in_backward: Some(false),
        ..Options::default()
    };
    let c = common::compiled_with(&common::example("gpt2"), &options);
    let plan = c.plan.plan();
    assert!(!plan.steps.iter().any(|s| matches!(s.op, Op::AdamW(_))));
    let groups = (plan.steps.iter())
        .filter(|s| matches!(s.op, Op::AdamWGroup { .. }))
        .count();
    assert_eq!(groups, 13);
    assert_eq!(plan.arena_bytes, 3_462_000_644);
}
