//! Type rule, cost and precision class of `Dequantize`: a packed `u8` buffer of exactly the
//! layout's bytes in, the weight in a floating compute precision out.

use crate::ir::{DType, Op, TensorType};
use crate::ops::rules::{arity, fail, foreign, Behaviour, PrecisionClass, Result, Rules};

impl Rules for super::Family {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
        let Op::Dequantize { quant, to } = op else {
            return foreign(op, "quant");
        };
        arity(op, inputs, 1, 1)?;
        let packed = TensorType::new(DType::U8, vec![quant.packed_bytes() as usize]);
        if *inputs[0] != packed {
            return fail(
                format!(
                    "a {} {}x{} weight is packed as {packed}, found {}",
                    quant.scheme, quant.shape[0], quant.shape[1], inputs[0]
                ),
                "dequantize reads the packed buffer of its own layout",
            );
        }
        if !to.is_float() || quant.out_axis > 1 {
            return fail(
                format!(
                    "cannot dequantize to {to} with output axis {}",
                    quant.out_axis
                ),
                "weights dequantize to f32, f16 or bf16 with output channels on axis 0 or 1",
            );
        }
        Ok(TensorType::new(*to, quant.shape.to_vec()))
    }

    /// One multiply per weight.
    fn flops(&self, _op: &Op, _inputs: &[&TensorType], out: &TensorType) -> u64 {
        out.numel()
    }

    /// Cheap, and read as it is: the quantize pass runs after mixed precision and makes the
    /// weight in the precision its matmuls read.
    fn behaviour(&self, _op: &Op) -> Behaviour {
        Behaviour::CHEAP.in_precision(PrecisionClass::AsIs)
    }
}
