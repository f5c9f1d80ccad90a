//! Shape and dtype rule, cost and class of the copies between tiers: a copy to the host, and
//! a copy from the host into a new device buffer, has its input's type; a copy to the device
//! writes its first input in place from its second, of the same type, and outputs an empty
//! tensor, as the optimizer updates do.

use crate::ir::{DType, Op, OpClass, TensorType};
use crate::ops::rules::{arity, fail, foreign, Behaviour, Result, Rules};

impl Rules for super::Family {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
        match op {
            Op::CopyToHost | Op::CopyFromHost => {
                arity(op, inputs, 1, 1)?;
                Ok(inputs[0].clone())
            }
            Op::CopyToDevice => {
                arity(op, inputs, 2, 2)?;
                if inputs[0] != inputs[1] {
                    return fail(
                        format!("copy of {} into {}", inputs[1], inputs[0]),
                        "a copy to the device writes a buffer of its source's type",
                    );
                }
                Ok(TensorType::new(DType::F32, vec![0]))
            }
            _ => foreign(op, "transfer"),
        }
    }

    /// A copy computes nothing; its cost is the bytes it moves over the link
    /// (`crate::cost::link`).
    fn flops(&self, _: &Op, _: &[&TensorType], _: &TensorType) -> u64 {
        0
    }

    fn behaviour(&self, op: &Op) -> Behaviour {
        Behaviour {
            class: OpClass::Update,
            mutated_inputs: match op {
                Op::CopyToDevice => &[0],
                _ => &[],
            },
            ..Behaviour::CHEAP
        }
    }
}
