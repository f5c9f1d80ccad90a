//! Shared test cases: a representative op/shape set covering every kernel family.
#![allow(clippy::panic, dead_code)]

mod attention;
mod conv;
mod ignore;
pub mod mixed_types;
mod multi_block;
pub mod quant;
pub mod select;
pub mod updates;

use updates::{adamw8, adamw8_inputs};

use memc::codegen::{kernel_for, Kernel};
use memc::ir::infer::infer;
use memc::ir::*;
use memc::ops::optimizer::{Rounding, StateFormat};

/// A tensor type.
pub fn t(dtype: DType, shape: &[usize]) -> TensorType {
    TensorType::new(dtype, shape.to_vec())
}

/// AdamW with the usual lr, betas and eps, and `weight_decay`.
pub fn adamw(weight_decay: f32) -> AdamWParams {
    AdamWParams {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay,
        ..AdamWParams::default()
    }
}

/// The fused loss head's attributes.
fn lce(chunk: usize, transposed: bool) -> LinearCe {
    LinearCe {
        chunk,
        transposed,
        ce: CeParams::default(),
    }
}

/// A fused loss head's backward op.
fn lce_bwd(chunk: usize, transposed: bool, which: LceGrad) -> Op {
    Op::LinearCrossEntropyBackward {
        lce: lce(chunk, transposed),
        which,
    }
}

/// The inputs of a fused loss head's backward: hidden states `rows ++ [dim]`, the weight,
/// targets, and f32 per-row losses and their gradient.
fn lce_bwd_in(rows: &[usize], dim: usize, w: &[usize]) -> Vec<TensorType> {
    let mut x = rows.to_vec();
    x.push(dim);
    vec![
        t(DType::F32, &x),
        t(DType::F32, w),
        t(DType::I32, rows),
        t(DType::F32, rows),
        t(DType::F32, rows),
    ]
}

/// A matmul transposing as `ta` / `tb`, its output fp32 when `f32_out`, with a bias input when
/// `bias`.
fn matmul(ta: bool, tb: bool, f32_out: bool, bias: bool) -> Op {
    Op::MatMul {
        ta,
        tb,
        f32_out,
        bias,
    }
}

/// (label, op, inputs) in f32; `with_dtype` derives the f16/bf16 variants.
pub fn cases() -> Vec<(&'static str, Op, Vec<TensorType>)> {
    use DType::{F32, I32};
    let f = |s: &[usize]| t(F32, s);
    let pool = PoolParams {
        kernel: [3, 3],
        stride: [2, 2],
        padding: [1, 1],
    };
    let adam = adamw(0.01);
    let sgd = SgdParams {
        lr: 0.1,
        momentum: 0.9,
        weight_decay: 0.0,
        rounding: Rounding::Nearest,
    };
    let mut cases = vec![
        (
            "fill",
            Op::Fill {
                value: 1.0,
                ty: f(&[4, 5]),
            },
            vec![],
        ),
        ("unary", Op::Unary(UnaryFn::GeluTanh), vec![f(&[4, 33])]),
        ("unary_erf", Op::Unary(UnaryFn::GeluErf), vec![f(&[7])]),
        ("unary_erf_fn", Op::Unary(UnaryFn::Erf), vec![f(&[7])]),
        (
            "unary_softplus",
            Op::Unary(UnaryFn::Softplus),
            vec![f(&[4, 33])],
        ),
        (
            "unary_softplus_bwd",
            Op::UnaryBackward(UnaryFn::Softplus),
            vec![f(&[4, 33]), f(&[4, 33])],
        ),
        (
            "unary_bwd",
            Op::UnaryBackward(UnaryFn::Silu),
            vec![f(&[4, 33]), f(&[4, 33])],
        ),
        (
            "unary_out_bwd_relu",
            Op::UnaryOutputBackward(UnaryFn::Relu),
            vec![f(&[4, 33]), f(&[4, 33])],
        ),
        (
            "unary_out_bwd_tanh",
            Op::UnaryOutputBackward(UnaryFn::Tanh),
            vec![f(&[5, 7]), f(&[5, 7])],
        ),
        (
            "binary",
            Op::Binary(BinaryFn::Add),
            vec![f(&[2, 3, 4]), f(&[3, 1])],
        ),
        (
            "binary_div",
            Op::Binary(BinaryFn::Div),
            vec![f(&[5, 1]), f(&[1, 6])],
        ),
        (
            "affine",
            Op::Affine {
                scale: 0.5,
                shift: -1.0,
            },
            vec![f(&[10])],
        ),
        ("sum_to", Op::sum_to(vec![4]), vec![f(&[2, 3, 4])]),
        (
            "sum_to_keep",
            Op::sum_to(vec![2, 1, 4]),
            vec![f(&[2, 3, 4])],
        ),
        (
            "broadcast_to",
            Op::BroadcastTo {
                shape: vec![2, 3, 4],
            },
            vec![f(&[3, 1])],
        ),
        ("max_to", Op::MaxTo { shape: vec![2, 1] }, vec![f(&[2, 50])]),
        (
            "max_to_bwd",
            Op::MaxToBackward,
            vec![f(&[2, 50]), f(&[2, 1]), f(&[2, 1])],
        ),
        ("softmax", Op::Softmax { axis: 1 }, vec![f(&[3, 70, 2])]),
        (
            "softmax_bwd",
            Op::SoftmaxBackward { axis: 2 },
            vec![f(&[3, 5, 70]), f(&[3, 5, 70])],
        ),
        (
            "log_softmax",
            Op::LogSoftmax { axis: 1 },
            vec![f(&[8, 100])],
        ),
        (
            "log_softmax_bwd",
            Op::LogSoftmaxBackward { axis: 1 },
            vec![f(&[8, 100]), f(&[8, 100])],
        ),
        (
            "layer_norm",
            Op::norm(NormKind::Layer, 1e-5),
            vec![f(&[6, 64]), f(&[64]), f(&[64])],
        ),
        (
            "rms_norm",
            Op::norm(NormKind::Rms, 1e-6),
            vec![f(&[6, 64]), f(&[64])],
        ),
        (
            "batch_norm",
            Op::norm(NormKind::Batch, 1e-5),
            vec![f(&[2, 3, 4, 4]), f(&[3]), f(&[3])],
        ),
        (
            "group_norm",
            Op::norm(NormKind::Group(2), 1e-5),
            vec![f(&[2, 4, 3, 3]), f(&[4]), f(&[4])],
        ),
        (
            "layer_norm_bwd_in",
            Op::NormBackwardInput {
                kind: NormKind::Layer,
                eps: 1e-5,
            },
            vec![f(&[6, 64]), f(&[64]), f(&[6, 64])],
        ),
        (
            "group_norm_bwd_in",
            Op::NormBackwardInput {
                kind: NormKind::Group(2),
                eps: 1e-5,
            },
            vec![f(&[2, 4, 3, 3]), f(&[4]), f(&[2, 4, 3, 3])],
        ),
        (
            "rms_norm_bwd_w",
            Op::NormBackwardWeight {
                kind: NormKind::Rms,
                eps: 1e-6,
            },
            vec![f(&[6, 64]), f(&[6, 64])],
        ),
        (
            "batch_norm_bwd_w",
            Op::NormBackwardWeight {
                kind: NormKind::Batch,
                eps: 1e-5,
            },
            vec![f(&[2, 3, 4, 4]), f(&[2, 3, 4, 4])],
        ),
        (
            "group_norm_bwd_w",
            Op::NormBackwardWeight {
                kind: NormKind::Group(2),
                eps: 1e-5,
            },
            vec![f(&[2, 4, 3, 3]), f(&[2, 4, 3, 3])],
        ),
        (
            "layer_norm_bwd_b",
            Op::NormBackwardBias {
                kind: NormKind::Layer,
            },
            vec![f(&[6, 64])],
        ),
        (
            "embedding",
            Op::Embedding { padding_idx: None },
            vec![f(&[50, 16]), t(I32, &[2, 7])],
        ),
        (
            "embedding_bwd",
            Op::EmbeddingBackward {
                rows: 50,
                padding_idx: None,
            },
            vec![t(I32, &[2, 7]), f(&[2, 7, 16])],
        ),
        // Every row among the ids: the padding row's are skipped.
        (
            "embedding_bwd_padding",
            Op::EmbeddingBackward {
                rows: 4,
                padding_idx: Some(1),
            },
            vec![t(I32, &[2, 7]), f(&[2, 7, 16])],
        ),
        (
            "cross_entropy",
            Op::CrossEntropy(CeParams::default()),
            vec![f(&[2, 7, 50]), t(I32, &[2, 7])],
        ),
        (
            "linear_ce",
            Op::LinearCrossEntropy(lce(3, false)),
            vec![f(&[2, 7, 16]), f(&[16, 50]), t(I32, &[2, 7])],
        ),
        (
            "linear_ce_tied",
            Op::LinearCrossEntropy(lce(13, true)),
            vec![f(&[40, 16]), f(&[80, 16]), t(I32, &[40])],
        ),
        (
            "linear_ce_bwd_x",
            lce_bwd(3, false, LceGrad::Input),
            lce_bwd_in(&[2, 7], 16, &[16, 50]),
        ),
        (
            "linear_ce_bwd_x_tied",
            lce_bwd(13, true, LceGrad::Input),
            lce_bwd_in(&[40], 16, &[80, 16]),
        ),
        (
            "linear_ce_bwd_x_wide",
            lce_bwd(2, false, LceGrad::Input),
            lce_bwd_in(&[3], 300, &[300, 10]),
        ),
        (
            "linear_ce_bwd_w",
            lce_bwd(3, false, LceGrad::Weight),
            lce_bwd_in(&[2, 7], 16, &[16, 50]),
        ),
        (
            "linear_ce_bwd_w_tied",
            lce_bwd(13, true, LceGrad::Weight),
            lce_bwd_in(&[40], 16, &[80, 16]),
        ),
        (
            "linear_ce_bwd_w_wide",
            lce_bwd(2, false, LceGrad::Weight),
            lce_bwd_in(&[3], 300, &[300, 10]),
        ),
        ("mse", Op::Mse, vec![f(&[9, 3]), f(&[9, 3])]),
        (
            "mse_bwd",
            Op::MseBackward,
            vec![f(&[9, 3]), f(&[9, 3]), f(&[])],
        ),
        (
            "reshape",
            Op::Reshape { shape: vec![6, 4] },
            vec![f(&[2, 3, 4])],
        ),
        (
            "permute",
            Op::Permute {
                perm: vec![2, 0, 1],
            },
            vec![f(&[2, 3, 4])],
        ),
        (
            "slice",
            Op::Slice {
                axis: 1,
                start: 1,
                end: 3,
            },
            vec![f(&[2, 4, 5])],
        ),
        (
            "pad_slice",
            Op::PadSlice {
                axis: 1,
                start: 1,
                full: 4,
            },
            vec![f(&[2, 2, 5])],
        ),
        (
            "concat",
            Op::Concat { axis: 1 },
            vec![f(&[2, 2, 5]), f(&[2, 3, 5]), f(&[2, 1, 5])],
        ),
        (
            "matmul",
            Op::matmul(false, false),
            vec![f(&[2, 3, 65, 17]), f(&[17, 70])],
        ),
        (
            "matmul_t",
            Op::matmul(true, true),
            vec![f(&[3, 1, 17, 65]), f(&[4, 70, 17])],
        ),
        (
            "matmul_bias",
            matmul(false, false, false, true),
            vec![f(&[2, 3, 65, 17]), f(&[17, 70]), f(&[70])],
        ),
        (
            "matmul_t_bias",
            matmul(true, true, false, true),
            vec![f(&[3, 1, 17, 65]), f(&[4, 70, 17]), f(&[70])],
        ),
        (
            "matmul_f32_out",
            matmul(true, false, true, false),
            vec![f(&[130, 33]), f(&[130, 70])],
        ),
        (
            "matmul_bias_grad",
            Op::MatMulBiasGrad {
                ta: true,
                tb: false,
                f32_out: true,
            },
            // 32 x 72 products: a multiple of 128 elements, so no gap before the sums
            // (whose bytes no view reads and cuBLASLt leaves unwritten).
            vec![f(&[130, 32]), f(&[130, 72])],
        ),
        (
            "matmul_bias_grad_t",
            Op::MatMulBiasGrad {
                ta: false,
                tb: true,
                f32_out: false,
            },
            vec![f(&[32, 130]), f(&[72, 130])],
        ),
        (
            "sum_to_f32_out",
            Op::SumTo {
                shape: vec![70],
                f32_out: true,
            },
            vec![f(&[3, 130, 70])],
        ),
        (
            "layer_norm_store_bf16",
            Op::Norm {
                kind: NormKind::Layer,
                eps: 1e-5,
                store: Some(DType::BF16),
            },
            vec![f(&[6, 64]), f(&[64]), f(&[64])],
        ),
        ("max_pool", Op::MaxPool2d(pool), vec![f(&[2, 3, 8, 8])]),
        (
            "max_pool_bwd",
            Op::MaxPool2dBackward(pool),
            vec![f(&[2, 3, 8, 8]), f(&[2, 3, 4, 4])],
        ),
        ("avg_pool", Op::AvgPool2d(pool), vec![f(&[2, 3, 8, 8])]),
        (
            "avg_pool_bwd",
            Op::AvgPool2dBackward {
                pool,
                input: [8, 8],
            },
            vec![f(&[2, 3, 4, 4])],
        ),
        ("dropout", Op::Dropout { p: 0.1, seed: 7 }, vec![f(&[100])]),
        (
            "rope",
            Op::Rope {
                heads: 4,
                base: 10000.0,
                inverse: false,
            },
            vec![f(&[2, 10, 64])],
        ),
        (
            "rope_inv",
            Op::Rope {
                heads: 4,
                base: 10000.0,
                inverse: true,
            },
            vec![f(&[2, 10, 64])],
        ),
        (
            "clip",
            Op::ClipCoefficient {
                max_norm: 1.0,
                scaled: false,
            },
            vec![f(&[10, 3]), f(&[7])],
        ),
        (
            "clip_scaled",
            Op::ClipCoefficient {
                max_norm: 1.0,
                scaled: true,
            },
            vec![f(&[10, 3]), f(&[7]), t(F32, &[])],
        ),
        (
            "unscale",
            Op::UnscaleGrads,
            vec![t(F32, &[]), f(&[10, 3]), f(&[7])],
        ),
        (
            "accumulate_grad",
            Op::AccumulateGrad { micro_steps: 4 },
            vec![t(F32, &[10, 3]), f(&[10, 3])],
        ),
        (
            "loss_scale_update",
            Op::LossScaleUpdate {
                growth_interval: 2000,
            },
            vec![t(F32, &[]), t(F32, &[]), t(F32, &[])],
        ),
        (
            "batch_norm_stats",
            Op::BatchNormStats { momentum: 0.1 },
            vec![t(F32, &[3]), t(F32, &[3]), f(&[2, 3, 4, 5])],
        ),
        (
            "adamw",
            Op::AdamW(adam),
            vec![f(&[10]), f(&[10]), f(&[10]), f(&[10])],
        ),
        (
            "adamw_clip",
            Op::AdamW(adam),
            vec![f(&[10]), f(&[10]), f(&[10]), f(&[10]), f(&[])],
        ),
        (
            "adamw_group",
            Op::AdamWGroup {
                hyper: adam,
                tensors: 3,
            },
            [vec![f(&[10]); 4], vec![f(&[37]); 4], vec![f(&[3, 5]); 4]].concat(),
        ),
        (
            "adamw_group_clip",
            Op::AdamWGroup {
                hyper: adam,
                tensors: 2,
            },
            [vec![f(&[700]); 4], vec![f(&[9]); 4], vec![f(&[])]].concat(),
        ),
        ("adamw8", Op::AdamW(adamw8(0.01)), adamw8_inputs(2048 + 900)),
        ("sgd", Op::Sgd(sgd), vec![f(&[10]), f(&[10]), f(&[10])]),
        (
            "sgd_clip",
            Op::Sgd(sgd),
            vec![f(&[10]), f(&[10]), f(&[10]), f(&[])],
        ),
    ];
    cases.extend(attention::cases());
    cases.extend(conv::cases());
    cases.extend(multi_block::cases());
    cases.extend(ignore::cases());
    cases
}

/// `inputs` with every floating tensor switched to `dtype`, but for scalars (clip and unscale
/// multipliers, the loss scale), gradient accumulators, batch norm's running statistics and
/// 8-bit AdamW's absmaxes, which the optimizer pass and the front end always make f32, and the fused loss head's per-row losses and their
/// gradient, always f32.
pub fn with_dtype(op: &Op, inputs: &[TensorType], dtype: DType) -> (Op, Vec<TensorType>) {
    let conv = |x: &TensorType| {
        if x.dtype.is_float() && !x.shape.is_empty() {
            x.with_dtype(dtype)
        } else {
            x.clone()
        }
    };
    let op = match op {
        Op::Fill { value, ty } => Op::Fill {
            value: *value,
            ty: conv(ty),
        },
        other => other.clone(),
    };
    let accumulator = |i: usize| match op {
        Op::AccumulateGrad { .. } => i == 0,
        Op::BatchNormStats { .. } => i < 2,
        Op::LinearCrossEntropyBackward { .. } => i >= 3,
        Op::AdamW(p) => p.state == StateFormat::Int8 && i >= 4,
        _ => false,
    };
    let inputs = inputs
        .iter()
        .enumerate()
        .map(|(i, x)| if accumulator(i) { x.clone() } else { conv(x) })
        .collect();
    (op, inputs)
}

/// The output type shape inference assigns.
pub fn output(op: &Op, inputs: &[TensorType]) -> TensorType {
    let refs: Vec<&TensorType> = inputs.iter().collect();
    match infer(op, &refs) {
        Ok(t) => t,
        Err(e) => panic!("bad test case {op:?}: {}", e.message),
    }
}

/// One case at one dtype, with its kernel.
pub struct KernelCase {
    /// `label/dtype`.
    pub label: String,
    pub dtype: DType,
    pub op: Op,
    pub f32_op: Op,
    pub f32_inputs: Vec<TensorType>,
    pub inputs: Vec<TensorType>,
    pub output: TensorType,
    pub kernel: Kernel,
}

/// Every case in f32, f16 and bf16 (the optimizers' clip coefficient stays f32, as the clip
/// op always produces it), in case order; panics naming a case that has no kernel.
pub fn kernel_cases() -> Vec<KernelCase> {
    kernel_cases_of(cases())
}

/// The given (label, op, f32 inputs) cases in f32, f16 and bf16, as [`kernel_cases`] does.
pub fn kernel_cases_of(cases: Vec<(&'static str, Op, Vec<TensorType>)>) -> Vec<KernelCase> {
    let mut out = Vec::new();
    for (label, f32_op, f32_inputs) in cases {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let (op, inputs) = with_dtype(&f32_op, &f32_inputs, dtype);
            let output = output(&op, &inputs);
            let kernel = kernel_for(&op, &inputs, &output)
                .unwrap_or_else(|e| panic!("{label}/{dtype}: {e}"))
                .unwrap_or_else(|| panic!("{label}/{dtype}: no kernel"));
            out.push(KernelCase {
                label: format!("{label}/{dtype}"),
                dtype,
                op,
                f32_op: f32_op.clone(),
                f32_inputs: f32_inputs.clone(),
                inputs,
                output,
                kernel,
            });
        }
    }
    out
}
