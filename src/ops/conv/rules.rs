//! Shape and dtype rule, cost and precision class of the conv ops.

use crate::ir::{Op, OpClass, TensorType, TypeError};
use crate::ops::rules::{PrecisionClass, Rules};

impl Rules for super::Family {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<TensorType, TypeError> {
        crate::ir::infer::infer_legacy(op, inputs)
    }

    fn flops(&self, op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
        crate::ir::cost::flops_legacy(op, inputs, out)
    }

    fn precision(&self, op: &Op) -> PrecisionClass {
        crate::passes::precision::rule_legacy(op)
    }

    fn class(&self, op: &Op) -> OpClass {
        op.class_legacy()
    }

    fn mutated_inputs(&self, op: &Op) -> &'static [usize] {
        op.mutated_inputs_legacy()
    }
}
