//! Shape and dtype rule, cost and precision class of the source ops: inputs, parameters,
//! optimizer state and fills take no inputs and have the type they declare.

use crate::ir::{Op, OpClass, TensorType};
use crate::ops::rules::{arity, elementwise_flops, foreign, Behaviour, Result, Rules};

impl Rules for super::Family {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
        match op {
            Op::Input { ty, .. }
            | Op::Param { ty, .. }
            | Op::OptimState { ty, .. }
            | Op::Fill { ty, .. } => {
                arity(op, inputs, 0, 0)?;
                Ok(ty.clone())
            }
            _ => foreign(op, "source"),
        }
    }

    fn flops(&self, op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
        match op {
            Op::Fill { .. } => elementwise_flops(inputs, out),
            _ => 0,
        }
    }

    fn behaviour(&self, op: &Op) -> Behaviour {
        match op {
            Op::Fill { .. } => Behaviour::CHEAP,
            _ => Behaviour {
                class: OpClass::Source,
                ..Behaviour::CHEAP
            },
        }
    }
}
