//! Shape and dtype rule, cost and precision class of the cast between floating types, and
//! of a group of casts packed into one flat output.

use crate::ir::{Op, TensorType};
use crate::ops::rules::{arity, elementwise_flops, fail, float, foreign, Behaviour, Result, Rules};

impl Rules for super::Family {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
        let (Op::Cast { to } | Op::CastGroup { to, .. }) = op else {
            return foreign(op, "cast");
        };
        let count = match op {
            Op::CastGroup { tensors, .. } => (*tensors as usize).max(1),
            _ => 1,
        };
        arity(op, inputs, count, count)?;
        float(inputs[0], "a cast's input")?;
        if !to.is_float() {
            return fail(
                format!("cannot cast {} to {to}", inputs[0]),
                "casts convert between floating types",
            );
        }
        if let Some(x) = inputs.iter().find(|x| x.dtype != inputs[0].dtype) {
            return fail(
                format!("a cast group of {} and {x}", inputs[0]),
                "a cast group converts tensors of one type",
            );
        }
        match op {
            Op::CastGroup { .. } => {
                let total = inputs.iter().map(|x| x.numel() as usize).sum();
                Ok(TensorType::new(*to, vec![total]))
            }
            _ => Ok(inputs[0].with_dtype(*to)),
        }
    }

    fn flops(&self, _op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
        elementwise_flops(inputs, out)
    }

    fn behaviour(&self, _op: &Op) -> Behaviour {
        Behaviour::CHEAP
    }
}
