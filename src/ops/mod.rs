//! The op registry: each op family lives in one folder, `src/ops/<family>/`, holding every
//! stage's rule for its ops — shape and dtype rule, cost and precision class (`rules.rs`),
//! backward rule (`backward.rs`), CPU kernel and its workspace (`cpu.rs`), CUDA lowering with
//! its `.cu` template (`cuda.rs`). Passes and backends call these through [`OpFamily`] and
//! keep no per-op `match` of their own; [`family`] is the one dispatch from an [`Op`] to
//! its family.

pub mod backward;
pub mod cpu;
pub mod cuda;
pub mod rules;

pub mod attention;
pub mod cast;
pub mod collective;
pub mod conv;
pub mod embedding;
pub mod loss;
pub mod matmul;
pub mod movement;
pub mod norm;
pub mod optimizer;
pub mod pointwise;
pub mod pool;
pub mod quant;
pub mod random;
pub mod reduce;
pub mod softmax;
pub mod source;
pub mod transfer;

use crate::ir::Op;

/// Every stage's rule for the ops of one family. The stage traits have no default methods,
/// so a new family does not compile until each stage is answered.
pub trait OpFamily:
    rules::Rules + backward::Backward + cpu::CpuKernel + cuda::CudaLowering + Sync
{
}

/// Where the second of two tensors packed into one flat buffer starts and how many elements
/// the buffer holds, for a first of `first` elements and a second of `second`, both of
/// `elem_bytes` bytes: the second starts at the first 256-byte boundary after the first
/// (where a buffer of its own could start), the gap between them zero.
pub fn packed_pair(first: u64, second: u64, elem_bytes: u64) -> (u64, u64) {
    let align = (256 / elem_bytes.max(1)).max(1);
    let at = first.div_ceil(align) * align;
    (at, at + second)
}

/// The family that holds `op`'s rules.
pub fn family(op: &Op) -> &'static dyn OpFamily {
    match op {
        Op::Input { .. } | Op::Param { .. } | Op::OptimState { .. } | Op::Fill { .. } => {
            &source::Family
        }
        Op::Unary(_)
        | Op::UnaryBackward(_)
        | Op::UnaryOutputBackward(_)
        | Op::UnaryPair(_)
        | Op::Binary(_)
        | Op::Where
        | Op::Clamp(_)
        | Op::ClampBackward(_)
        | Op::Affine { .. } => &pointwise::Family,
        Op::Cast { .. } | Op::CastGroup { .. } => &cast::Family,
        Op::SumTo { .. } | Op::BroadcastTo { .. } | Op::MaxTo { .. } | Op::MaxToBackward => {
            &reduce::Family
        }
        Op::Softmax { .. }
        | Op::SoftmaxBackward { .. }
        | Op::LogSoftmax { .. }
        | Op::LogSoftmaxBackward { .. } => &softmax::Family,
        Op::Norm { .. }
        | Op::AddNorm { .. }
        | Op::NormBackwardInput { .. }
        | Op::NormBackwardWeight { .. }
        | Op::NormBackward { .. }
        | Op::NormBackwardBias { .. }
        | Op::BatchNormStats { .. } => &norm::Family,
        Op::Embedding { .. } | Op::EmbeddingBackward { .. } => &embedding::Family,
        Op::CrossEntropy(_)
        | Op::CrossEntropyBackward(_)
        | Op::KeptCount(_)
        | Op::LinearCrossEntropy(_)
        | Op::LinearCrossEntropyBackward { .. }
        | Op::Mse
        | Op::MseBackward => &loss::Family,
        Op::Reshape { .. }
        | Op::Member { .. }
        | Op::Permute { .. }
        | Op::Slice { .. }
        | Op::PadSlice { .. }
        | Op::Concat { .. } => &movement::Family,
        Op::MatMul { .. } | Op::MatMulBiasGrad { .. } => &matmul::Family,
        Op::Dequantize { .. } => &quant::Family,
        Op::Conv(_)
        | Op::ConvBackwardInput { .. }
        | Op::ConvBackwardWeight { .. }
        | Op::ConvTranspose { .. } => &conv::Family,
        Op::MaxPool2d(_)
        | Op::MaxPool2dBackward(_)
        | Op::AvgPool2d(_)
        | Op::AvgPool2dBackward { .. } => &pool::Family,
        Op::Dropout { .. } => &random::Family,
        Op::Attention(_)
        | Op::AttentionBackward { .. }
        | Op::PackedAttention(_)
        | Op::PackedAttentionBackward(_)
        | Op::Rope { .. } => &attention::Family,
        Op::ClipCoefficient { .. }
        | Op::UnscaleGrads
        | Op::LossScaleUpdate { .. }
        | Op::AccumulateGrad { .. }
        | Op::AdamW(_)
        | Op::AdamWGroup { .. }
        | Op::Sgd(_) => &optimizer::Family,
        Op::CopyToHost | Op::CopyToDevice | Op::CopyFromHost => &transfer::Family,
        Op::AllReduce { .. }
        | Op::ReduceScatter { .. }
        | Op::AllGather { .. }
        | Op::AllGatherInto { .. }
        | Op::Shard { .. }
        | Op::TensorCopy { .. }
        | Op::TensorReduce { .. }
        | Op::PipelineSend(_)
        | Op::PipelineRecv { .. } => &collective::Family,
    }
}
