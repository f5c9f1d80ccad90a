//! Shape and dtype rule, cost and class of the collectives: an all-reduce keeps its input's
//! type; a reduce-scatter and a shard give a flat shard of it; an all-gather gives the shape
//! it names from a flat shard of that many elements; an all-gather into a buffer writes it in
//! place (an fp32 shard into a 16-bit buffer rounded to it) and outputs an empty tensor, as
//! the optimizer updates do; a tensor-parallel region's entry and the tensor ranks' sum
//! keep their input's type.

use super::shard_len;
use crate::ir::{DType, Op, OpClass, TensorType};
use crate::ops::rules::{arity, fail, float, foreign, Behaviour, PrecisionClass, Result, Rules};

/// The flat shard type of `t` over `ranks` ranks.
fn shard_of(t: &TensorType, ranks: u32) -> TensorType {
    TensorType::new(t.dtype, vec![shard_len(t.numel(), ranks) as usize])
}

fn ranks_positive(ranks: u32) -> Result<()> {
    if ranks == 0 {
        return fail(
            "a collective over 0 ranks",
            "a collective spans at least 1 rank",
        );
    }
    Ok(())
}

/// Checks that `shard` is the flat shard of a tensor of `full`'s elements.
fn is_shard_of(shard: &TensorType, full: &TensorType, ranks: u32) -> Result<()> {
    if shard != &shard_of(full, ranks) {
        return fail(
            format!("{shard} is not a shard of {full} over {ranks} ranks"),
            "a shard holds ceil(numel / ranks) elements of its tensor's dtype",
        );
    }
    Ok(())
}

impl Rules for super::Family {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
        match op {
            Op::AllReduce { ranks } => {
                arity(op, inputs, 1, 1)?;
                ranks_positive(*ranks)?;
                float(inputs[0], "an all-reduce's input")?;
                Ok(inputs[0].clone())
            }
            Op::TensorCopy { ranks } | Op::TensorReduce { ranks } => {
                arity(op, inputs, 1, 1)?;
                ranks_positive(*ranks)?;
                float(inputs[0], "a tensor-parallel collective's input")?;
                Ok(inputs[0].clone())
            }
            Op::ReduceScatter { ranks } | Op::Shard { ranks } => {
                arity(op, inputs, 1, 1)?;
                ranks_positive(*ranks)?;
                float(inputs[0], "a shard's input")?;
                Ok(shard_of(inputs[0], *ranks))
            }
            Op::AllGather { ranks, shape } => {
                arity(op, inputs, 1, 1)?;
                ranks_positive(*ranks)?;
                let full = TensorType::new(inputs[0].dtype, shape.clone());
                is_shard_of(inputs[0], &full, *ranks)?;
                Ok(full)
            }
            Op::AllGatherInto { ranks } => {
                arity(op, inputs, 2, 2)?;
                ranks_positive(*ranks)?;
                // An fp32 master shard gathers into its 16-bit parameter, rounded.
                let (dst, src) = (inputs[0], inputs[1]);
                let widened =
                    src.dtype == DType::F32 && matches!(dst.dtype, DType::BF16 | DType::F16);
                let full = match widened {
                    true => dst.with_dtype(DType::F32),
                    false => dst.clone(),
                };
                is_shard_of(src, &full, *ranks)?;
                Ok(TensorType::new(DType::F32, vec![0]))
            }
            Op::PipelineSend(_) => {
                arity(op, inputs, 1, 1)?;
                Ok(TensorType::new(DType::F32, vec![]))
            }
            Op::PipelineRecv { ty, .. } => {
                arity(op, inputs, 0, 0)?;
                Ok(ty.clone())
            }
            _ => foreign(op, "collective"),
        }
    }

    /// An all-reduce or reduce-scatter adds the other ranks' values (one FLOP an element a
    /// rank); gathers and shards move bytes only.
    fn flops(&self, op: &Op, inputs: &[&TensorType], _: &TensorType) -> u64 {
        match op {
            Op::AllReduce { ranks } | Op::ReduceScatter { ranks } | Op::TensorReduce { ranks } => {
                inputs.first().map_or(0, |t| t.numel()) * u64::from(ranks.saturating_sub(1))
            }
            _ => 0,
        }
    }

    /// Gathers and shards of parameters are cheap forward work (recomputed for backward as a
    /// weight copy is), as is a tensor-parallel region's entry (a view of its input); the
    /// tensor ranks' sum is forward work recomputed only when the budget demands it, as a
    /// matmul is; the reductions and the gather into a parameter belong to the update, and
    /// pipeline sends and receives, which must run exactly once each, are never recomputed
    /// (a value crosses stages in fp32, as its receiver's type says).
    fn behaviour(&self, op: &Op) -> Behaviour {
        match op {
            Op::AllGather { .. } | Op::Shard { .. } | Op::TensorCopy { .. } => Behaviour::CHEAP,
            Op::TensorReduce { .. } => Behaviour {
                class: OpClass::Heavy,
                ..Behaviour::CHEAP
            },
            Op::PipelineSend(_) | Op::PipelineRecv { .. } => Behaviour {
                class: OpClass::Update,
                precision: PrecisionClass::Fp32,
                ..Behaviour::CHEAP
            },
            _ => Behaviour {
                class: OpClass::Update,
                mutated_inputs: match op {
                    Op::AllGatherInto { .. } => &[0],
                    _ => &[],
                },
                ..Behaviour::CHEAP
            },
        }
    }
}
