//! Backward rule of the collectives: gathering a parameter's shards (ZeRO-3) has the
//! reduce-scatter of its gradient as its gradient, so each rank receives its shard of the
//! ranks' mean gradient. Megatron's conjugate pair: the gradient of a tensor-parallel
//! region's entry (`f`) is the tensor ranks' sum of the partial gradients, and the sum
//! after a row-parallel matmul (`g`) passes its gradient unchanged. A pipeline send's
//! gradient is received back from the stage it sent to; a receive has no input, and
//! autodiff sends the gradient of its value back itself (`crate::passes::autodiff`). The
//! other collectives are inserted after differentiation.

use crate::ir::Op;
use crate::ops::backward::{Backward, Vjp};
use crate::passes::StageError;

impl Backward for super::Family {
    fn vjp(&self, op: &Op, cx: &mut Vjp<'_>) -> Result<(), StageError> {
        let dy = cx.dy;
        match op {
            Op::AllGather { ranks, .. } => {
                let ranks = *ranks;
                cx.set(0, |rw| rw.add(Op::ReduceScatter { ranks }, vec![dy]))
            }
            Op::TensorCopy { ranks } => {
                let ranks = *ranks;
                cx.set(0, |rw| rw.add(Op::TensorReduce { ranks }, vec![dy]))
            }
            Op::TensorReduce { .. } => cx.set(0, |_| Ok(dy)),
            Op::PipelineSend(link) => {
                let (link, x) = (link.gradient(), cx.x[0]);
                cx.set(0, |rw| {
                    let ty = crate::ir::TensorType::new(rw.dtype(x), rw.shape(x));
                    rw.add(
                        Op::PipelineRecv {
                            link,
                            ty,
                            trained: false,
                        },
                        vec![],
                    )
                })
            }
            Op::PipelineRecv { .. } => Ok(()),
            Op::AllReduce { .. }
            | Op::ReduceScatter { .. }
            | Op::AllGatherInto { .. }
            | Op::Shard { .. } => Err(cx.not_forward(op)),
            _ => Err(cx.foreign(op, "collective")),
        }
    }
}
