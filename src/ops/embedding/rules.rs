//! Shape and dtype rule, cost and precision class of the embedding lookup and its
//! scatter-add backward.

use crate::ir::{Op, TensorType};
use crate::ops::rules::{
    arity, elementwise_flops, fail, float, foreign, int, rank_at_least, rank_exactly, Behaviour,
    Result, Rules,
};

impl Rules for super::Family {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
        match op {
            Op::Embedding { .. } => {
                arity(op, inputs, 2, 2)?;
                let (table, ids) = (inputs[0], inputs[1]);
                rank_exactly(table, 2, "embedding table")?;
                float(table, "embedding table")?;
                int(ids, "embedding ids")?;
                let mut shape = ids.shape.clone();
                shape.push(table.shape[1]);
                Ok(TensorType::new(table.dtype, shape))
            }
            Op::EmbeddingBackward { rows, .. } => {
                arity(op, inputs, 2, 2)?;
                let (ids, dy) = (inputs[0], inputs[1]);
                int(ids, "embedding ids")?;
                rank_at_least(ids, 1, "embedding ids")?;
                match dy.shape.split_last() {
                    Some((&d, lead)) if lead == ids.shape => {
                        Ok(TensorType::new(dy.dtype, vec![*rows, d]))
                    }
                    _ => fail(
                        format!("embedding gradient {dy} does not match ids {ids}"),
                        "the gradient must have the ids' shape plus the embedding width",
                    ),
                }
            }
            _ => foreign(op, "embedding"),
        }
    }

    fn flops(&self, _op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
        elementwise_flops(inputs, out)
    }

    fn behaviour(&self, _op: &Op) -> Behaviour {
        Behaviour::CHEAP
    }
}
