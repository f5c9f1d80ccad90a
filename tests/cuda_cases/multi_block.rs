//! Op cases whose kernels spread a reduction over many blocks, at sizes that give several
//! blocks and a partial last one: norm weight and bias gradients over row and sample chunks,
//! norm forwards, input gradients and running statistics over slices of few large groups,
//! embedding backward row tiles, the scalar losses, the fused loss head's sliced log-sum-exp
//! and its merged backward's tiles,
//! the convolution weight gradient split over K, and the gradient reductions.

use super::t;
use memc::ir::*;

/// Gradients of 9,119 elements in all, for the multi-block gradient reductions.
fn many_grads() -> Vec<TensorType> {
    [&[40, 100][..], &[7], &[3000], &[64, 33]]
        .iter()
        .map(|s| t(DType::F32, s))
        .collect()
}

/// The multi-block cases, as `super::cases` lists them.
pub fn cases() -> Vec<(&'static str, Op, Vec<TensorType>)> {
    use DType::{F32, I32};
    let f = |s: &[usize]| t(F32, s);
    vec![
        // The weight and bias gradients over many row chunks (the last one partial), and
        // over channels a thread owns several of.
        (
            "layer_norm_bwd_w_chunks",
            Op::NormBackwardWeight {
                kind: NormKind::Layer,
                eps: 1e-5,
            },
            vec![f(&[301, 24]), f(&[301, 24])],
        ),
        (
            "layer_norm_bwd_w_wide",
            Op::NormBackwardWeight {
                kind: NormKind::Layer,
                eps: 1e-5,
            },
            vec![f(&[5, 300]), f(&[5, 300])],
        ),
        (
            "layer_norm_bwd_b_chunks",
            Op::NormBackwardBias {
                kind: NormKind::Layer,
            },
            vec![f(&[301, 24])],
        ),
        // 64 channels: sample chunks of 2, the last one short.
        (
            "batch_norm_bwd_w_chunks",
            Op::NormBackwardWeight {
                kind: NormKind::Batch,
                eps: 1e-5,
            },
            vec![f(&[7, 64, 3]), f(&[7, 64, 3])],
        ),
        (
            "batch_norm_bwd_b_chunks",
            Op::NormBackwardBias {
                kind: NormKind::Batch,
            },
            vec![f(&[7, 64, 3])],
        ),
        (
            "batch_norm_bwd_b",
            Op::NormBackwardBias {
                kind: NormKind::Batch,
            },
            vec![f(&[2, 3, 4, 4])],
        ),
        (
            "group_norm_bwd_b",
            Op::NormBackwardBias {
                kind: NormKind::Group(2),
            },
            vec![f(&[3, 4, 5])],
        ),
        // Few statistics groups of over 1,024 elements: each group in slices, merged by a
        // finishing launch (`norm::cuda::slices`). Batch: 3 channels of 2,940 in 3 slices of
        // 980, boundaries inside a sample; group: 4 groups of 1,083 in slices of 542 and 541,
        // a boundary inside a channel; RMS: 2 rows of 3,000 in 3 slices.
        (
            "batch_norm_slices",
            Op::norm(NormKind::Batch, 1e-5),
            vec![f(&[7, 3, 20, 21]), f(&[3]), f(&[3])],
        ),
        (
            "batch_norm_bwd_in_slices",
            Op::NormBackwardInput {
                kind: NormKind::Batch,
                eps: 1e-5,
            },
            vec![f(&[7, 3, 20, 21]), f(&[3]), f(&[7, 3, 20, 21])],
        ),
        (
            "batch_norm_stats_slices",
            Op::BatchNormStats { momentum: 0.1 },
            vec![f(&[3]), f(&[3]), f(&[7, 3, 20, 21])],
        ),
        (
            "group_norm_slices",
            Op::norm(NormKind::Group(2), 1e-5),
            vec![f(&[2, 6, 19, 19]), f(&[6]), f(&[6])],
        ),
        (
            "group_norm_bwd_in_slices",
            Op::NormBackwardInput {
                kind: NormKind::Group(2),
                eps: 1e-5,
            },
            vec![f(&[2, 6, 19, 19]), f(&[6]), f(&[2, 6, 19, 19])],
        ),
        (
            "rms_norm_slices",
            Op::norm(NormKind::Rms, 1e-6),
            vec![f(&[2, 3000]), f(&[3000])],
        ),
        (
            "layer_norm_bwd_in_slices",
            Op::NormBackwardInput {
                kind: NormKind::Layer,
                eps: 1e-5,
            },
            vec![f(&[2, 3000]), f(&[3000]), f(&[2, 3000])],
        ),
        (
            "rms_norm_bwd_in_slices",
            Op::NormBackwardInput {
                kind: NormKind::Rms,
                eps: 1e-6,
            },
            vec![f(&[2, 3000]), f(&[3000]), f(&[2, 3000])],
        ),
        // A norm's gradients in one pass (`norm_backward`). A layer norm's input, weight and
        // bias gradients and the sum of its input gradient rounded to fp16 (not a coarser
        // type than the case's, which would round twice), 300 rows of 128 channels in 150
        // chunks of 2 rows, 4 channels a thread; the same without the sum over 150 rows; an
        // RMS norm's input gradient adding a residual gradient and its weight gradient, over
        // 7 rows of 384 channels, 6 a thread. Every gradient starts right after the one
        // before in every type (no gap to compare).
        (
            "layer_norm_bwd_all",
            Op::NormBackward {
                kind: NormKind::Layer,
                eps: 1e-5,
                bias: true,
                sum: Some(DType::F16),
                copy: None,
            },
            vec![f(&[300, 128]), f(&[128]), f(&[300, 128])],
        ),
        (
            "layer_norm_bwd_all_unsummed",
            Op::NormBackward {
                kind: NormKind::Layer,
                eps: 1e-5,
                bias: true,
                sum: None,
                copy: None,
            },
            vec![f(&[150, 128]), f(&[128]), f(&[150, 128])],
        ),
        (
            "rms_norm_bwd_all_acc",
            Op::NormBackward {
                kind: NormKind::Rms,
                eps: 1e-6,
                bias: false,
                sum: None,
                copy: None,
            },
            vec![f(&[7, 384]), f(&[384]), f(&[7, 384]), f(&[7, 384])],
        ),
        // Channels times samples too few to fill an H100: each sample's positions in equal
        // slices (`norm::cuda::sample_slices`). Batch: 2 samples x 3 channels of 2,048 in 2
        // slices; group: 2 samples x 4 channels (2 groups) of 3,072 in 3 slices.
        (
            "batch_norm_bwd_w_samples",
            Op::NormBackwardWeight {
                kind: NormKind::Batch,
                eps: 1e-5,
            },
            vec![f(&[2, 3, 2048]), f(&[2, 3, 2048])],
        ),
        (
            "batch_norm_bwd_b_samples",
            Op::NormBackwardBias {
                kind: NormKind::Batch,
            },
            vec![f(&[2, 3, 2048])],
        ),
        (
            "group_norm_bwd_w_samples",
            Op::NormBackwardWeight {
                kind: NormKind::Group(2),
                eps: 1e-5,
            },
            vec![f(&[2, 4, 3072]), f(&[2, 4, 3072])],
        ),
        (
            "group_norm_bwd_b_samples",
            Op::NormBackwardBias {
                kind: NormKind::Group(2),
            },
            vec![f(&[2, 4, 3072])],
        ),
        // Few outputs of many elements: sum and max in slices (`geometry::slices`), 5 outputs
        // of 2,100 in 3 slices of 700, 3 of 1,500 in 2 of 750.
        ("sum_to_slices", Op::sum_to(vec![5]), vec![f(&[2100, 5])]),
        (
            "max_to_slices",
            Op::MaxTo { shape: vec![3, 1] },
            vec![f(&[3, 1500])],
        ),
        // Row tiles of 4 (the last one partial), several windows of ids, untouched rows.
        (
            "embedding_bwd_tiles",
            Op::EmbeddingBackward {
                rows: 1001,
                padding_idx: None,
            },
            vec![t(I32, &[3, 50]), f(&[3, 50, 100])],
        ),
        // More rows than the first launch has blocks: blocks take several rows.
        (
            "cross_entropy_rows",
            Op::CrossEntropy(CeParams::default()),
            vec![f(&[1100, 3]), t(I32, &[1100])],
        ),
        (
            "cross_entropy_bwd",
            Op::CrossEntropyBackward(CeParams::default()),
            vec![f(&[2, 7, 50]), t(I32, &[2, 7]), f(&[])],
        ),
        // Two chunks, the last one element short.
        ("mse_chunks", Op::Mse, vec![f(&[51, 61]), f(&[51, 61])]),
        // A weight gradient with one output tile per group and K = 2 x 20 x 20 = 800: its K
        // in 12 splits of 67 (as many as give each of an H100's SMs a block, each at least 64
        // long), the last one short, summed by a finishing launch.
        (
            "conv2d_bwd_w_split_k",
            Op::ConvBackwardWeight {
                conv: ConvParams {
                    groups: 2,
                    ..ConvParams::uniform(2, 1, 1, 1)
                },
                kernel: vec![3, 3],
            },
            vec![f(&[2, 4, 20, 20]), f(&[2, 6, 20, 20])],
        ),
        // Each row's log-sum-exp in 4 column slices of 1,025 classes, the last one short.
        (
            "linear_ce_slices",
            Op::LinearCrossEntropy(super::lce(3, false)),
            vec![f(&[5, 8]), f(&[8, 4099]), t(I32, &[5])],
        ),
        // A chunk of at least an H100's SMs in rows: each row's loss in one stage.
        (
            "linear_ce_one_stage",
            Op::LinearCrossEntropy(super::lce(140, false)),
            vec![f(&[150, 8]), f(&[8, 20]), t(I32, &[150])],
        ),
        // Chunks (input gradient) and rows (weight gradients) of at least an H100's SMs: the
        // logits' gradient is written over the logits, a block a row (the cases above, with
        // fewer rows, write it apart, a thread an element).
        (
            "linear_ce_bwd_x_in_place",
            super::lce_bwd(140, false, LceGrad::Input),
            super::lce_bwd_in(&[160], 8, &[8, 20]),
        ),
        (
            "linear_ce_bwd_w_in_place",
            super::lce_bwd(140, true, LceGrad::Weight),
            super::lce_bwd_in(&[160], 8, &[20, 8]),
        ),
        (
            "linear_ce_bwd_both_in_place",
            super::lce_bwd(140, false, LceGrad::Both),
            super::lce_bwd_in(&[160], 8, &[8, 20]),
        ),
        // Both gradients in one pass: the input gradient summed in fp32 over 10 and over 5
        // column tiles (the last one narrower), then rounded into the packed output.
        (
            "linear_ce_bwd_both",
            super::lce_bwd(3, false, LceGrad::Both),
            super::lce_bwd_in(&[2, 7], 16, &[16, 50]),
        ),
        (
            "linear_ce_bwd_both_tied",
            super::lce_bwd(13, true, LceGrad::Both),
            super::lce_bwd_in(&[40], 16, &[80, 16]),
        ),
        // Three chunks of the gradients' flat index space, boundaries inside tensors and a
        // chunk spanning three of them.
        (
            "clip_chunks",
            Op::ClipCoefficient {
                max_norm: 1.0,
                scaled: true,
            },
            [many_grads(), vec![t(F32, &[])]].concat(),
        ),
        (
            "unscale_chunks",
            Op::UnscaleGrads,
            [vec![t(F32, &[])], many_grads()].concat(),
        ),
    ]
}
