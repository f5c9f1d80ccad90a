//! The compiler's launch-saving folds on a mixed-precision GPT-2 step for CUDA, asserted on
//! the plan (their values are checked where the gradients are: against PyTorch in
//! `precision.rs`, by finite differences in `gradcheck.rs`, through the shim in `shim.rs`):
//! a bias is added in its matmul's epilogue, a bias gradient is summed in its weight
//! gradient's epilogue or by a norm's gradient, a layer
//! norm read only as bf16 stores bf16, attention reads q, k and v packed in the qkv product
//! and writes their gradient in one op, residual adds read their bf16 branch as it is, a
//! norm's input gradient adds the residual gradient itself, backward reads saved
//! activations reshaped as views, a
//! block's AdamW steps are one group, its parameter casts one cast group, and the fused loss
//! head takes at most 16 chunks and computes both its gradients in one op, and backward's
//! recomputed GELU comes with its gradient (the grouped updates train bit for bit as single ones:
//! `offload.rs`, whose offloaded updates are not grouped).
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use memc::ir::{DType, Op};
use memc::settings::Precision;
use memc::Options;

#[test]
fn a_bf16_gpt2_step_folds_biases_casts_pads_and_chunks() {
    let options = Options {
        precision: Some(Precision::Bf16),
        target: memc::plan::Target::CUDA_MIN,
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
    // Bias gradients: fp32 sums, and no cast reads a sum. The qkv and fc biases' are summed
    // by cuBLASLt in the epilogue of their weight gradients' GEMMs (fp32, both gradients
    // views of one output); the proj and fc_proj biases' by the norm gradient below them
    // on the residual stream (`norm_backward`, counted below). No bias has a sum of its own.
    let wide_sums = count(&|s| {
        matches!(s.op, Op::SumTo { f32_out: true, .. })
            && s.output.as_ref().map(dtype) == Some(DType::F32)
    });
    assert_eq!(
        wide_sums, 0,
        "every bias gradient summed beside another gradient"
    );
    let with_bias_grads = count(&|s| {
        matches!(s.op, Op::MatMulBiasGrad { f32_out: true, .. })
            && s.output.as_ref().map(dtype) == Some(DType::F32)
    });
    assert_eq!(with_bias_grads, 2 * layers, "qkv and fc biases");
    let bias_grad_views = count(&|s| {
        matches!(s.op, Op::Member { .. })
            && (s.inputs.iter()).any(|b| matches!(producer(b), Some(Op::MatMulBiasGrad { .. })))
            && !plan.launches(s)
    });
    assert_eq!(bias_grad_views, 2 * 2 * layers);
    let cast_of = |s: &memc::plan::Step, what: fn(&Op) -> bool| {
        matches!(s.op, Op::Cast { .. }) && s.inputs.first().and_then(producer).is_some_and(what)
    };
    assert_eq!(
        count(&|s| cast_of(s, |op| matches!(op, Op::SumTo { .. }))),
        0
    );
    // Layer norms (two a layer and the final one) store bf16 themselves, in forward and in
    // their recomputation for backward; no cast reads a norm. The second of each layer is
    // one `add_norm` with the attention's residual add whose sum it reads, in forward and in
    // backward's recomputation.
    let narrow = count(&|s| {
        matches!(
            s.op,
            Op::Norm {
                store: Some(DType::BF16),
                ..
            } | Op::AddNorm {
                store: Some(DType::BF16),
                ..
            }
        )
    });
    assert_eq!(narrow, 2 * (2 * layers + 1));
    assert_eq!(count(&|s| matches!(s.op, Op::AddNorm { .. })), 2 * layers);
    assert_eq!(
        count(&|s| cast_of(s, |op| matches!(op, Op::Norm { .. }))),
        0
    );
    // Parameter casts: the four weights and four biases of layers 0 to 10 are one cast
    // group in forward (the parameters made first, so one group may take later layers'),
    // the top layer's another (held with the others to its forward, the peak would rise);
    // for backward, the weights of layers 10 to 2 are recast in one group and those of
    // layers 1 and 0 in another, while the top layer's, recast where the step is at its
    // peak, stay apart; the token embedding is cast alone, in forward and for backward.
    let groups = |phase, tensors| {
        count(&|s| {
            s.phase == phase
                && s.op
                    == Op::CastGroup {
                        to: DType::BF16,
                        tensors,
                    }
        })
    };
    assert_eq!(groups(memc::ir::Phase::Forward, 8 * 11), 1);
    assert_eq!(groups(memc::ir::Phase::Forward, 8), 1);
    assert_eq!(groups(memc::ir::Phase::Backward, 4), 0);
    assert_eq!(groups(memc::ir::Phase::Backward, 4 * 9), 1);
    assert_eq!(groups(memc::ir::Phase::Backward, 4 * 2), 1);
    let param_cast = |s: &memc::plan::Step| {
        matches!(s.op, Op::Cast { .. })
            && plan.buffers[s.inputs[0].index()].class == memc::plan::BufferClass::Param
    };
    assert_eq!(count(&param_cast), 4 + 2);
    // The optimizer runs in backward: each block instance's parameters are one group, run
    // once its last gradient is complete (holding its weights' gradients until then does
    // not raise the peak, which is the loss head); the top level's small parameters (the
    // final norm) are one group, while the two embeddings are stepped as their gradients
    // complete (holding the final norm's gradients until the token embedding's would raise
    // the peak of live bytes by their 6,144 bytes).
    let single = count(&|s| matches!(s.op, Op::AdamW(_)));
    assert_eq!(single, 2);
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
    // no add of a vector reads a product.
    assert_eq!(
        count(&|s| matches!(s.op, Op::MatMul { bias: true, .. })),
        4 * layers
    );
    let vector = |b: &memc::plan::BufferId| plan.buffers[b.index()].ty.shape.len() == 1;
    let add_of_product = |s: &memc::plan::Step| {
        matches!(s.op, Op::Binary(memc::ir::BinaryFn::Add))
            && (s.inputs.iter()).any(|b| matches!(producer(b), Some(Op::MatMul { .. })))
            && s.inputs.iter().any(vector)
    };
    assert_eq!(count(&add_of_product), 0);
    // The residual adds read their bf16 branch as it is, widening each element as they load
    // it: two a layer, the first (the attention's) recomputed in backward, both times one
    // `add_norm` with the norm of its sum, and the sum of the two embedding gradients; no
    // cast to fp32 feeds arithmetic.
    let mixed = |s: &memc::plan::Step| {
        let types: Vec<DType> = s.inputs.iter().map(dtype).collect();
        matches!(
            s.op,
            Op::Binary(memc::ir::BinaryFn::Add) | Op::AddNorm { .. }
        ) && types[..2].contains(&DType::F32)
            && types[..2].contains(&DType::BF16)
    };
    assert_eq!(count(&mixed), 3 * layers + 1);
    let widened = |s: &memc::plan::Step| {
        matches!(s.op, Op::Binary(_))
            && (s.inputs.iter()).any(|b| producer(b) == Some(&Op::Cast { to: DType::F32 }))
    };
    assert_eq!(count(&widened), 0);
    // Each layer norm's gradients are one op (input, weight and bias, `norm_backward`), whose
    // input gradient takes in the residual gradient passed down the stream (two a layer: the
    // final norm's has nothing to add); no add reads one, and its gradients are views of its
    // output. Each but the first layer's first also sums its input gradient cast to bf16:
    // the bias gradient of the linear layer below it on the residual stream.
    let norm_grads = |s: &memc::plan::Step| matches!(s.op, Op::NormBackward { bias: true, .. });
    let accumulating = |s: &memc::plan::Step| norm_grads(s) && s.inputs.len() == 4;
    assert_eq!(
        (count(&norm_grads), count(&accumulating)),
        (2 * layers + 1, 2 * layers)
    );
    let apart = |s: &memc::plan::Step| {
        matches!(
            s.op,
            Op::NormBackwardInput { .. } | Op::NormBackwardWeight { .. }
        )
    };
    assert_eq!(count(&apart), 0);
    let add_of_norm_gradient = |s: &memc::plan::Step| {
        matches!(s.op, Op::Binary(memc::ir::BinaryFn::Add))
            && (s.inputs.iter()).any(|b| matches!(producer(b), Some(Op::NormBackward { .. })))
    };
    assert_eq!(count(&add_of_norm_gradient), 0);
    let norm_views = |s: &memc::plan::Step| {
        matches!(s.op, Op::Member { .. })
            && (s.inputs.iter()).any(|b| matches!(producer(b), Some(Op::NormBackward { .. })))
            && !plan.launches(s)
    };
    let summed = |s: &memc::plan::Step| {
        matches!(
            s.op,
            Op::NormBackward {
                sum: Some(DType::BF16),
                ..
            }
        )
    };
    assert_eq!(count(&summed), 2 * layers);
    // Those also store their input gradient's bf16 copy, which the matmuls below read: no
    // cast launches on a norm's gradient (the final norm's is the loss head's gradient's,
    // which no matmul reads).
    let copied = |s: &memc::plan::Step| {
        matches!(
            s.op,
            Op::NormBackward {
                copy: Some(DType::BF16),
                ..
            }
        )
    };
    assert_eq!(count(&copied), 2 * layers);
    let cast_of_norm_gradient = |s: &memc::plan::Step| {
        matches!(s.op, Op::Cast { .. })
            && (s.inputs.iter()).any(|b| {
                let member = (plan.steps.iter()).find(|p| p.output == Some(*b));
                member.is_some_and(|m| {
                    matches!(m.op, Op::Member { .. })
                        && (m.inputs.iter())
                            .any(|r| matches!(producer(r), Some(Op::NormBackward { .. })))
                })
            })
    };
    assert_eq!(count(&cast_of_norm_gradient), 0);
    assert_eq!(count(&norm_views), 3 * (2 * layers + 1) + 4 * layers);
    // Backward reads each saved attention output reshaped for the projection's weight
    // gradient as a view of it: no reshape launches a copy.
    let copies = count(&|s| matches!(s.op, Op::Reshape { .. }) && plan.launches(s));
    assert_eq!(copies, 0);
    // A layer norm's bias gradient is a sum over rows; no q/k/v slice is copied, the qkv
    // product itself is saved for backward.
    assert_eq!(count(&|s| matches!(s.op, Op::NormBackwardBias { .. })), 0);
    assert_eq!(count(&|s| matches!(s.op, Op::Slice { .. })), 0);
    // The loss head, its logits in bf16: 8 x 1024 rows in 8 chunks of 1024 backward (as many
    // bytes as 16 chunks of fp32 logits), in 5 of 1639 forward (the room the step's peak,
    // backward's, leaves there), its two gradients one backward op (the logits computed once
    // for both) whose packed output both are views of.
    let chunks: Vec<(bool, usize)> = (plan.steps.iter())
        .filter_map(|s| match &s.op {
            Op::LinearCrossEntropy(lce) => Some((true, lce.chunk)),
            Op::LinearCrossEntropyBackward { lce, .. } => Some((false, lce.chunk)),
            _ => None,
        })
        .collect();
    assert_eq!(chunks, vec![(true, 1639), (false, 1024)]);
    let head_backward =
        |s: &memc::plan::Step| matches!(s.op, Op::LinearCrossEntropyBackward { .. });
    let merged = |s: &memc::plan::Step| {
        matches!(
            s.op,
            Op::LinearCrossEntropyBackward {
                which: memc::ir::LceGrad::Both,
                ..
            }
        )
    };
    assert_eq!((count(&head_backward), count(&merged)), (1, 1));
    let views = |s: &memc::plan::Step| {
        matches!(s.op, Op::Member { .. })
            && (s.inputs.iter())
                .any(|b| matches!(producer(b), Some(Op::LinearCrossEntropyBackward { .. })))
            && !plan.launches(s)
    };
    assert_eq!(count(&views), 2);
    // Backward's recomputed GELU and its gradient are one launch in each layer.
    let pairs = count(&|s| matches!(s.op, Op::UnaryPair(_)));
    let apart = count(&|s| matches!(s.op, Op::UnaryBackward(_)));
    assert_eq!((pairs, apart), (layers, 0));
    // On the CPU backend the two stay apart (each gives the merged op's bits).
    let cpu = common::compiled_with(
        &common::example("gpt2"),
        &Options {
            target: memc::plan::Target::Cpu,
            ..options.clone()
        },
    );
    let cpu_plan = cpu.plan.plan();
    let apart = (cpu_plan.steps.iter()).filter(|s| head_backward(s) && !merged(s));
    assert_eq!(apart.count(), 2);
    let norms = (cpu_plan.steps.iter()).filter(|s| matches!(s.op, Op::NormBackward { .. }));
    assert_eq!(norms.count(), 0);
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
