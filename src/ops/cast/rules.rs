//! Shape and dtype rule, cost and precision class of the cast between floating types.

use crate::ir::{Op, TensorType};
use crate::ops::rules::{arity, elementwise_flops, fail, float, foreign, Behaviour, Result, Rules};

impl Rules for super::Family {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
        let Op::Cast { to } = op else {
            return foreign(op, "cast");
        };
        arity(op, inputs, 1, 1)?;
        float(inputs[0], "a cast's input")?;
        if !to.is_float() {
            return fail(
                format!("cannot cast {} to {to}", inputs[0]),
                "casts convert between floating types",
            );
        }
        Ok(inputs[0].with_dtype(*to))
    }

    fn flops(&self, _op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
        elementwise_flops(inputs, out)
    }

    fn behaviour(&self, _op: &Op) -> Behaviour {
        Behaviour::CHEAP
    }
}
