//! Shape and dtype rule, cost and precision class of dropout.

use crate::ir::{Op, OpClass, TensorType};
use crate::ops::rules::{arity, elementwise_flops, fail, float, foreign, Behaviour, Result, Rules};

impl Rules for super::Family {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
        let Op::Dropout { p, .. } = op else {
            return foreign(op, "random");
        };
        arity(op, inputs, 1, 1)?;
        float(inputs[0], "operand")?;
        if !(0.0..1.0).contains(p) {
            return fail(
                format!("dropout p = {p} is outside [0, 1)"),
                "use 0 <= p < 1",
            );
        }
        Ok(inputs[0].clone())
    }

    fn flops(&self, _op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
        elementwise_flops(inputs, out)
    }

    fn behaviour(&self, _op: &Op) -> Behaviour {
        Behaviour {
            class: OpClass::Random,
            ..Behaviour::CHEAP
        }
    }
}
