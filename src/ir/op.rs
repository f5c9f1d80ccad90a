//! The closed set of operations a graph node can perform. The ops' parameter types live
//! with their families in `src/ops/` and are re-exported here.

use super::{DType, TensorType};
use serde::{Deserialize, Serialize};

pub use crate::ops::attention::{AttnInput, AttnParams};
pub use crate::ops::collective::PipeLink;
pub use crate::ops::conv::ConvParams;
pub use crate::ops::loss::{CeParams, LceGrad, LinearCe};
pub use crate::ops::norm::NormKind;
pub use crate::ops::optimizer::{AdamWParams, SgdParams};
pub use crate::ops::pointwise::{BinaryFn, Bounds, UnaryFn};
pub use crate::ops::pool::PoolParams;
pub use crate::ops::quant::{Quantized, Scheme};

/// How a parameter is initialised (PyTorch conventions; `normal` has mean 0).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Init {
    Normal { std: f32 },
    Uniform { low: f32, high: f32 },
    Zeros,
    Ones,
}

/// One operation. Inputs are listed per variant in the order nodes hold them; every op has
/// exactly one output value, except that optimizer updates write their state inputs in place
/// (see [`Op::mutated_inputs`]) and output an empty tensor that only orders the step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// A tensor bound per step from outside (`input` declarations). No inputs.
    Input { name: String, ty: TensorType },
    /// A parameter, persistent across steps: trained, or `frozen` (read only: no gradient, no
    /// optimizer state). No inputs. A `buffer` is model state that is not a parameter (batch
    /// norm's running statistics, PyTorch's buffers): frozen, kept in fp32, saved and loaded
    /// with the parameters, written only in place by its forward's update step
    /// ([`Op::BatchNormStats`]) and not counted among the parameters.
    Param {
        name: String,
        ty: TensorType,
        init: Init,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        frozen: bool,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        buffer: bool,
    },
    /// Persistent state of the step that is not trained: a parameter's moments (init 0) or
    /// the fp16 loss scale and its clean-step counter. No inputs.
    OptimState {
        name: String,
        ty: TensorType,
        /// The value every element holds before the first step.
        #[serde(default)]
        init: f32,
    },
    /// A tensor filled with one value (the gradient seed of the loss). No inputs; a step.
    Fill { value: f32, ty: TensorType },
    /// `f(x)`.
    Unary(UnaryFn),
    /// `(x, dy) -> f'(x) * dy`.
    UnaryBackward(UnaryFn),
    /// `(y, dy) -> f'(x) * dy` from the forward output `y = f(x)`, for the functions whose
    /// derivative is a function of their output ([`UnaryFn::derivative_from_output`]).
    UnaryOutputBackward(UnaryFn),
    /// `(x, dy) -> f(x)` and `f'(x) * dy` in one launch, into one flat buffer of `x`'s type:
    /// `f(x)` from element 0, `f'(x) * dy` from [`crate::ops::packed_pair`]`.0`, each read
    /// through an [`Op::Member`] view (`passes::unary_pairs`: backward's recomputed
    /// activation beside its gradient).
    UnaryPair(UnaryFn),
    /// `(a, b) -> a op b`, broadcasting.
    Binary(BinaryFn),
    /// `(cond, a, b) -> a where cond is nonzero, else b`, all three broadcasting; `cond` is
    /// a mask in the operands' float dtype (NaN counts as nonzero). `cond` gets no gradient.
    Where,
    /// `x -> clamp(x, lo, hi)` with constant bounds ([`Bounds::clamp`]).
    Clamp(Bounds),
    /// `(x, dy) -> dy where lo <= x <= hi, else 0` ([`Bounds::passes`]).
    ClampBackward(Bounds),
    /// `x -> x * scale + shift`.
    Affine { scale: f32, shift: f32 },
    /// `x -> sum of x over the dims where `shape` has 1 (or that it lacks)`. With `f32_out`
    /// the output is fp32 whatever the input's precision: the fp32 sum stored unrounded (a
    /// low-precision bias gradient written straight into its fp32 gradient, `passes::widen`).
    SumTo {
        shape: Vec<usize>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        f32_out: bool,
    },
    /// `x -> x broadcast to shape`.
    BroadcastTo { shape: Vec<usize> },
    /// `x -> max of x over the dims where `shape` (same rank) has 1`.
    MaxTo { shape: Vec<usize> },
    /// `(x, y, dy) -> dx` for `y = MaxTo(x)`: the gradient goes to the first maximum.
    MaxToBackward,
    /// Softmax along `axis`.
    Softmax { axis: usize },
    /// `(y, dy) -> dx` for `y = softmax(x)`.
    SoftmaxBackward { axis: usize },
    /// Log-softmax along `axis`.
    LogSoftmax { axis: usize },
    /// `(y, dy) -> dx` for `y = log_softmax(x)`.
    LogSoftmaxBackward { axis: usize },
    /// `(x, weight[, bias]) -> normalize(x) * weight + bias`, computed in fp32 and stored in
    /// `x`'s precision or, with `store`, rounded once to that low precision (an fp32 norm
    /// whose only reader was a cast to it, `passes::widen::narrow_norms`).
    Norm {
        kind: NormKind,
        eps: f32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        store: Option<DType>,
    },
    /// `(a, b, weight[, bias]) -> [a + b | norm(a + b)]`: a residual add whose sum a layer or
    /// RMS norm reads, in one pass over the rows, flat in fp32 (the sum's type): the sum from
    /// element 0, the norm's output (in `store`, else fp32) from
    /// [`crate::ops::norm::add_norm_at`], each read through an [`Op::Member`] view
    /// (`passes::add_norm`); the same bits as the add, then [`Op::Norm`] on its sum.
    AddNorm {
        kind: NormKind,
        eps: f32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        store: Option<DType>,
    },
    /// `(x, weight, dy) -> dx`.
    NormBackwardInput { kind: NormKind, eps: f32 },
    /// `(x, dy) -> dweight`.
    NormBackwardWeight { kind: NormKind, eps: f32 },
    /// `(dy) -> dbias`.
    NormBackwardBias { kind: NormKind },
    /// `(x, weight, dy[, g]) -> [dx | dweight | dbias | dsum]`: a layer or RMS norm's input,
    /// weight and (`bias`) bias gradients in one pass over the rows, flat, each read through
    /// an [`Op::Member`] view at its offset of [`crate::ops::norm::GradsLayout`]; with `g`,
    /// `dx` is `g` plus the input gradient, as [`Op::NormBackwardInput`] of four inputs;
    /// with `sum = Some(t)`, also `dsum`, the sum over the rows of `dx` rounded to `t` (the
    /// bias gradient of a linear layer whose output `dx` is the gradient of, read through a
    /// cast to `t`), as `sum_to` of that cast (`passes::norm_backward_merge`); with
    /// `copy = Some(t)`, also `dx` rounded to `t` (that cast), read through a member of type
    /// `t`. A sum and a copy are of one type.
    NormBackward {
        kind: NormKind,
        eps: f32,
        bias: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sum: Option<DType>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        copy: Option<DType>,
    },
    /// `(running_mean[C], running_var[C], x[N, C, ...]) -> ()`: batch norm's running
    /// statistics moved towards `x`'s per-channel mean and unbiased variance, in place, as
    /// `torch.nn.BatchNorm` in training mode: `r = (1 - momentum) * r + momentum * batch`.
    BatchNormStats { momentum: f32 },
    /// `(table[V, D], ids) -> rows of table`, shape `ids ++ [D]`; ids equal to `padding_idx`
    /// send no gradient to the table (PyTorch's `nn.Embedding(padding_idx)`).
    Embedding {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        padding_idx: Option<usize>,
    },
    /// `(ids, dy) -> dtable[rows, D]` (scatter-add, skipping ids equal to `padding_idx`).
    EmbeddingBackward {
        rows: usize,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        padding_idx: Option<usize>,
    },
    /// `(logits[..., C], targets[...]) -> mean cross-entropy`, a scalar; with an ignored id,
    /// `(logits, targets, kept)`: the sum over the kept rows divided by `kept`, the
    /// [`Op::KeptCount`] of the targets.
    CrossEntropy(CeParams),
    /// `(logits, targets, dloss) -> dlogits`; with an ignored id `(logits, targets, dloss,
    /// kept)`, an ignored row's gradient 0.
    CrossEntropyBackward(CeParams),
    /// `(targets[...]) -> f32[]`: how many targets are not the ignored id, at least 1 (the
    /// divisor of a mean over kept rows, so that a step ignoring every row has loss 0).
    KeptCount(CeParams),
    /// `(x[..., D], w[D, V] (`[V, D]` when transposed), targets[...]) -> f32[...]`: each
    /// row's cross-entropy of the logits `x @ w` (fp32 accumulation and log-sum-exp), computed
    /// `chunk` rows at a time; the fused loss head never holds all the logits.
    LinearCrossEntropy(LinearCe),
    /// `(x, w, targets, rows, drows) -> dx or dw` for `rows = LinearCrossEntropy(x, w,
    /// targets)`: recomputes the logits chunk by chunk (the log-sum-exp comes from `rows`).
    LinearCrossEntropyBackward { lce: LinearCe, which: LceGrad },
    /// `(a, b) -> mean((a - b)^2)`, a scalar.
    Mse,
    /// `(a, b, dloss) -> da`.
    MseBackward,
    /// Same elements, new shape.
    Reshape { shape: Vec<usize> },
    /// `flat -> shape`: elements `offset .. offset + numel(shape)` of a 1-D tensor, as a
    /// tensor of `shape` (a member of an [`Op::CastGroup`]); a view of those bytes. With
    /// `dtype`, the member holds elements of that type from the byte where element `offset`
    /// of the flat tensor starts (a merged op's output of two types, such as a norm's fp32
    /// input gradient and its bf16 copy).
    Member {
        offset: usize,
        shape: Vec<usize>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dtype: Option<DType>,
    },
    /// Output dim i is input dim `perm[i]`.
    Permute { perm: Vec<usize> },
    /// `x[..., start..end, ...]` along `axis`.
    Slice {
        axis: usize,
        start: usize,
        end: usize,
    },
    /// Zero tensor with dim `axis` = `full`, holding x at `start..` (backward of Slice).
    PadSlice {
        axis: usize,
        start: usize,
        full: usize,
    },
    /// Concatenation of all inputs along `axis`.
    Concat { axis: usize },
    /// `(a, b) -> op(a) @ op(b)`, batched with broadcasting; `ta`/`tb` transpose the last two dims.
    /// With `f32_out` the output is fp32 whatever the operands' precision: the fp32
    /// accumulator stored unrounded (a low-precision weight gradient written straight into
    /// its fp32 gradient, `passes::widen`). With `bias` a third input, a vector of the
    /// output's last dim in the output's type, is added to every row of the fp32 product
    /// before its one rounding: cuBLASLt's bias epilogue (`passes::bias_epilogue`).
    MatMul {
        ta: bool,
        tb: bool,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        f32_out: bool,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        bias: bool,
    },
    /// `(x[k, m] or [m, k], y[k, n] or [n, k]) -> flat [op(x) @ op(y) | sum over k of op(y)]`:
    /// a weight gradient and, after it (from the product's elements rounded up to 128), the bias
    /// gradient of the same `dy` (`op(y)`'s column sums, accumulated in at least fp32, as
    /// `sum_to` sums, and rounded once), each read through an [`Op::Member`] view; in fp32
    /// with `f32_out`. cuBLASLt
    /// computes both in one call with its bias-gradient epilogue
    /// (`passes::bias_grad_epilogue`). Never differentiated.
    MatMulBiasGrad { ta: bool, tb: bool, f32_out: bool },
    /// `packed: u8[bytes] -> w[shape]` in `to`: a quantized frozen weight's packed buffer
    /// dequantized to the precision its matmuls read (`crate::ops::quant`).
    Dequantize { quant: Quantized, to: DType },
    /// `(x[N, C, spatial...], w[O, C/g, kernel...]) -> y[N, O, spatial'...]` over 1, 2 or 3
    /// spatial dimensions (NCL, NCHW, NCDHW).
    Conv(ConvParams),
    /// `(dy, w) -> dx`; `input` is the spatial size of x.
    ConvBackwardInput { conv: ConvParams, input: Vec<usize> },
    /// `(x, dy) -> dw`; `kernel` is the spatial size of w.
    ConvBackwardWeight {
        conv: ConvParams,
        kernel: Vec<usize>,
    },
    /// `(x[N, C, spatial...], w[C, O/g, kernel...]) -> y[N, O, output...]`: the transposed
    /// convolution, the adjoint of `Conv` with geometry `conv` from y to x (so `output` is
    /// the spatial size that convolution reads); computed as its input gradient.
    ConvTranspose {
        conv: ConvParams,
        output: Vec<usize>,
    },
    /// Max pooling over NCHW.
    MaxPool2d(PoolParams),
    /// `(x, dy) -> dx`.
    MaxPool2dBackward(PoolParams),
    /// Average pooling over NCHW (padding counted).
    AvgPool2d(PoolParams),
    /// `(dy) -> dx`; `input` is the spatial size of x.
    AvgPool2dBackward { pool: PoolParams, input: [usize; 2] },
    /// Inverted dropout with a counter-based mask keyed by `(seed, step, index)`; its backward
    /// is the same op on dy, which reproduces the mask.
    Dropout { p: f32, seed: u64 },
    /// `(q, k, v) -> out`, multi-head, never materializing scores.
    Attention(AttnParams),
    /// `(q, k, v, dout) -> d(which)`.
    AttentionBackward { attn: AttnParams, which: AttnInput },
    /// `x -> out`: attention whose q, k and v are the column blocks of one packed
    /// `x[B, T, (heads + 2 kv_heads) * dh]`, q first, then k, then v.
    PackedAttention(AttnParams),
    /// `(x, dout) -> dx`: the packed attention's gradient, `dq | dk | dv` along the last axis.
    PackedAttentionBackward(AttnParams),
    /// Rotary position embedding over `[B, T, heads*dh]`; `inverse` rotates back (its backward).
    Rope {
        heads: usize,
        base: f32,
        inverse: bool,
    },
    /// `x -> x` converted to `to` (round to nearest even when narrowing).
    Cast { to: DType },
    /// `(x0, x1, ..) -> [numel(x0) + numel(x1) + ..]`: `tensors` tensors of one float type
    /// converted to `to` as [`Op::Cast`] converts each, flattened one after the other in one
    /// launch (`passes::cast_groups`); each is read through an [`Op::Member`] view.
    CastGroup { to: DType, tensors: u32 },
    /// `(grads...) -> min(1, max_norm / (global L2 norm + 1e-6))`, a scalar. When `scaled`,
    /// the last input is the multiplier of [`Op::UnscaleGrads`]: the norm is that of the
    /// gradients times the multiplier, the result is multiplied by it, and 0 stays 0.
    ClipCoefficient {
        max_norm: f32,
        #[serde(default)]
        scaled: bool,
    },
    /// `(scale, grads...) -> 1/scale` when every gradient element is finite, else 0: the
    /// gradient multiplier of a loss-scaled step (0 means "skip the update").
    UnscaleGrads,
    /// `(scale, clean_steps, multiplier) -> ()`: dynamic loss scaling as `torch.amp.GradScaler`:
    /// on overflow (multiplier 0) halve the scale and reset the count; otherwise count the
    /// step and double the scale after `growth_interval` clean steps. Writes both in place.
    LossScaleUpdate { growth_interval: u32 },
    /// `(acc, grad) -> ()`: gradient accumulation over `micro_steps` micro-batches, in place:
    /// `acc = grad / micro_steps` on the first micro-step of a step, `acc += grad /
    /// micro_steps` on the others, so after the last `acc` is the full batch's gradient.
    AccumulateGrad { micro_steps: u32 },
    /// `(param, grad, m, v[, multiplier]) -> ()`: AdamW step writing param, m, v in place on
    /// the gradient times the multiplier; a multiplier of 0 skips the step.
    AdamW(AdamWParams),
    /// `(p0, g0, m0, v0, p1, g1, m1, v1, ..[, multiplier]) -> ()`: the AdamW steps of
    /// `tensors` parameters (fp32 moments, rounded to nearest) in one op, each exactly as
    /// `AdamW` would step it; one launch for all of them (`passes::group_updates`).
    AdamWGroup { hyper: AdamWParams, tensors: u32 },
    /// `(param, grad, momentum[, multiplier]) -> ()`: SGD step writing param and momentum in
    /// place, the multiplier as for AdamW.
    Sgd(SgdParams),
    /// `x -> x` in the host arena: the value of a device buffer copied to the host
    /// (`--offload`).
    CopyToHost,
    /// `(dst, src) -> ()`: host value `src` copied into device buffer `dst` in place, after
    /// every in-place writer of `src` in its phase ([`Op::reads_after_writers`]).
    CopyToDevice,
    /// `h -> h` in the device arena: host value `h` copied into a new device buffer (a saved
    /// activation's prefetch before its backward readers, `offload = activations`).
    CopyFromHost,
    /// `x -> x`: the mean over the data-parallel ranks of every rank's `x`, summed in rank
    /// order, so every rank holds the same bits.
    AllReduce { ranks: u32 },
    /// `x -> [ceil(numel/ranks)]`: this rank's slice of the flattened mean over the ranks
    /// (summed in rank order), zero past the end of `x`.
    ReduceScatter { ranks: u32 },
    /// `shard -> shape`: every rank's shard concatenated in rank order, the padding of the
    /// last dropped (a parameter gathered for its use under ZeRO-3).
    AllGather { ranks: u32, shape: Vec<usize> },
    /// `(dst, shard) -> ()`: every rank's shard concatenated in rank order into `dst` in
    /// place, after every in-place writer of `shard` in its phase (an updated shard).
    AllGatherInto { ranks: u32 },
    /// `x -> [ceil(numel/ranks)]`: this rank's slice of the flattened `x`, zero past its end;
    /// no communication.
    Shard { ranks: u32 },
    /// `x -> x`: Megatron's `f` at the entry of a tensor-parallel region: the same value on
    /// every tensor rank; its gradient is [`Op::TensorReduce`] of the incoming one.
    TensorCopy { ranks: u32 },
    /// `x -> x`: Megatron's `g` after a row-parallel matmul: the sum over the tensor ranks
    /// of every rank's partial `x`, summed in rank order; its gradient passes unchanged.
    TensorReduce { ranks: u32 },
    /// `x -> 0`: `x` sent to pipeline stage `link.peer` (an activation, or the gradient
    /// of one it sent), without waiting for it to be received; the fp32 scalar 0 it outputs
    /// makes it part of the stage's objective, so autodiff reaches it.
    PipelineSend(PipeLink),
    /// `() -> ty`: the value pipeline stage `link.peer` sends under the same link, waited
    /// for; `trained` says whether a trained parameter's gradient flows back through it.
    PipelineRecv {
        link: PipeLink,
        ty: TensorType,
        trained: bool,
    },
}

/// What kind of work an op is, for cost models and recomputation policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpClass {
    /// No computation: bound, persistent or constant.
    Source,
    /// Elementwise, data movement, norms, reductions: cheap to recompute.
    Cheap,
    /// Matmul, conv, attention: recomputed only when the budget demands it.
    Heavy,
    /// Random: recomputable only through its counter-based RNG.
    Random,
    /// Optimizer updates and their reductions: never recomputed.
    Update,
}

impl Op {
    /// `op(a) @ op(b)` in its operands' precision.
    pub fn matmul(ta: bool, tb: bool) -> Op {
        Op::MatMul {
            ta,
            tb,
            f32_out: false,
            bias: false,
        }
    }

    /// The normalization of `kind`, stored in its input's precision.
    pub fn norm(kind: NormKind, eps: f32) -> Op {
        Op::Norm {
            kind,
            eps,
            store: None,
        }
    }

    /// The sum of `x` onto `shape`, in its input's precision.
    pub fn sum_to(shape: Vec<usize>) -> Op {
        Op::SumTo {
            shape,
            f32_out: false,
        }
    }

    /// Elements `offset .. offset + numel(shape)` of a flat tensor as `shape`, in its type.
    pub fn member(offset: usize, shape: Vec<usize>) -> Op {
        Op::Member {
            offset,
            shape,
            dtype: None,
        }
    }

    /// The op's class, by its family's rule.
    pub fn class(&self) -> OpClass {
        crate::ops::family(self).behaviour(self).class
    }

    /// Indices of inputs this op overwrites in place (optimizer state and parameters).
    pub fn mutated_inputs(&self) -> &'static [usize] {
        crate::ops::family(self).behaviour(self).mutated_inputs
    }

    /// Whether this op copies between the device and the host tier (`--offload`).
    pub fn is_transfer(&self) -> bool {
        matches!(self, Op::CopyToHost | Op::CopyToDevice | Op::CopyFromHost)
    }

    /// Indices of inputs this op reads only after every in-place writer of them in the same
    /// phase has run (a copy back to the device reads the host value its update wrote);
    /// the schedule orders it after those writers instead of before.
    pub fn reads_after_writers(&self) -> &'static [usize] {
        match self {
            Op::CopyToDevice | Op::AllGatherInto { .. } => &[1],
            _ => &[],
        }
    }

    /// The short kernel name used in dumps and plans (`matmul`, `norm_backward_input`, ...).
    pub fn name(&self) -> &'static str {
        use Op::*;
        match self {
            Input { .. } => "input",
            Param { .. } => "param",
            OptimState { .. } => "optim_state",
            Fill { .. } => "fill",
            Unary(_) => "unary",
            UnaryBackward(_) => "unary_backward",
            UnaryPair(_) => "unary_pair",
            UnaryOutputBackward(_) => "unary_output_backward",
            Binary(_) => "binary",
            Where => "where",
            Clamp(_) => "clamp",
            ClampBackward(_) => "clamp_backward",
            Affine { .. } => "affine",
            SumTo { .. } => "sum_to",
            BroadcastTo { .. } => "broadcast_to",
            MaxTo { .. } => "max_to",
            MaxToBackward => "max_to_backward",
            Softmax { .. } => "softmax",
            SoftmaxBackward { .. } => "softmax_backward",
            LogSoftmax { .. } => "log_softmax",
            LogSoftmaxBackward { .. } => "log_softmax_backward",
            Norm { .. } => "norm",
            AddNorm { .. } => "add_norm",
            NormBackwardInput { .. } => "norm_backward_input",
            NormBackwardWeight { .. } => "norm_backward_weight",
            NormBackwardBias { .. } => "norm_backward_bias",
            NormBackward { .. } => "norm_backward",
            BatchNormStats { .. } => "batch_norm_stats",
            Embedding { .. } => "embedding",
            EmbeddingBackward { .. } => "embedding_backward",
            CrossEntropy(_) => "cross_entropy",
            CrossEntropyBackward(_) => "cross_entropy_backward",
            KeptCount(_) => "kept_count",
            LinearCrossEntropy(_) => "linear_cross_entropy",
            LinearCrossEntropyBackward {
                which: LceGrad::Input,
                ..
            } => "linear_cross_entropy_backward_input",
            LinearCrossEntropyBackward {
                which: LceGrad::Weight,
                ..
            } => "linear_cross_entropy_backward_weight",
            LinearCrossEntropyBackward {
                which: LceGrad::Both,
                ..
            } => "linear_cross_entropy_backward",
            Mse => "mse",
            MseBackward => "mse_backward",
            Reshape { .. } => "reshape",
            Member { .. } => "member",
            Permute { .. } => "permute",
            Slice { .. } => "slice",
            PadSlice { .. } => "pad_slice",
            Concat { .. } => "concat",
            MatMul { .. } => "matmul",
            MatMulBiasGrad { .. } => "matmul_bias_grad",
            Dequantize { .. } => "dequantize",
            Conv(c) => ["conv1d", "conv2d", "conv3d"][c.rank().clamp(1, 3) - 1],
            ConvBackwardInput { conv: c, .. } => [
                "conv1d_backward_input",
                "conv2d_backward_input",
                "conv3d_backward_input",
            ][c.rank().clamp(1, 3) - 1],
            ConvBackwardWeight { conv: c, .. } => [
                "conv1d_backward_weight",
                "conv2d_backward_weight",
                "conv3d_backward_weight",
            ][c.rank().clamp(1, 3) - 1],
            ConvTranspose { conv: c, .. } => {
                ["conv_transpose1d", "conv_transpose2d", "conv_transpose3d"]
                    [c.rank().clamp(1, 3) - 1]
            }
            MaxPool2d(_) => "max_pool2d",
            MaxPool2dBackward(_) => "max_pool2d_backward",
            AvgPool2d(_) => "avg_pool2d",
            AvgPool2dBackward { .. } => "avg_pool2d_backward",
            Dropout { .. } => "dropout",
            Attention(_) => "attention",
            AttentionBackward { .. } => "attention_backward",
            PackedAttention(_) => "packed_attention",
            PackedAttentionBackward(_) => "packed_attention_backward",
            Rope { .. } => "rope",
            Cast { .. } => "cast",
            CastGroup { .. } => "cast_group",
            ClipCoefficient { .. } => "clip_coefficient",
            UnscaleGrads => "unscale_grads",
            LossScaleUpdate { .. } => "loss_scale_update",
            AccumulateGrad { .. } => "accumulate_grad",
            AdamW(_) => "adamw",
            AdamWGroup { .. } => "adamw_group",
            Sgd(_) => "sgd",
            CopyToHost => "copy_to_host",
            CopyToDevice => "copy_to_device",
            CopyFromHost => "copy_from_host",
            AllReduce { .. } => "all_reduce",
            ReduceScatter { .. } => "reduce_scatter",
            AllGather { .. } => "all_gather",
            AllGatherInto { .. } => "all_gather_into",
            Shard { .. } => "shard",
            TensorCopy { .. } => "tensor_copy",
            PipelineSend(_) => "pipeline_send",
            PipelineRecv { .. } => "pipeline_recv",
            TensorReduce { .. } => "tensor_reduce",
        }
    }
}
