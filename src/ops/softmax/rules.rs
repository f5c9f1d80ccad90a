//! Shape and dtype rule, cost and precision class of softmax and log-softmax.

use crate::ir::{Op, TensorType};
use crate::ops::rules::{
    arity, axis_below_rank, first_numel, float, foreign, same_shape, Behaviour, PrecisionClass,
    Result, Rules,
};

impl Rules for super::Family {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
        match op {
            Op::Softmax { axis } | Op::LogSoftmax { axis } => {
                arity(op, inputs, 1, 1)?;
                float(inputs[0], "operand")?;
                axis_below_rank(inputs[0], *axis, "")?;
                Ok(inputs[0].clone())
            }
            Op::SoftmaxBackward { axis } | Op::LogSoftmaxBackward { axis } => {
                arity(op, inputs, 2, 2)?;
                same_shape(inputs[0], inputs[1], op.name())?;
                float(inputs[0], "operand")?;
                axis_below_rank(inputs[0], *axis, "")?;
                Ok(inputs[0].clone())
            }
            _ => foreign(op, "softmax"),
        }
    }

    fn flops(&self, _op: &Op, inputs: &[&TensorType], _out: &TensorType) -> u64 {
        5 * first_numel(inputs)
    }

    fn behaviour(&self, op: &Op) -> Behaviour {
        match op {
            Op::Softmax { .. } | Op::LogSoftmax { .. } => {
                Behaviour::CHEAP.in_precision(PrecisionClass::Fp32)
            }
            _ => Behaviour::CHEAP,
        }
    }
}
