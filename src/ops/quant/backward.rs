//! `Dequantize` has no backward rule: only frozen weights are quantized, and a frozen weight
//! gets no gradient, so autodiff never asks for one (its `u8` input cannot carry one).

use crate::ir::Op;
use crate::ops::backward::{Backward, Vjp};
use crate::passes::StageError;

impl Backward for super::Family {
    fn vjp(&self, op: &Op, _cx: &mut Vjp<'_>) -> Result<(), StageError> {
        Err(StageError::internal(
            "autodiff",
            format!(
                "`{}` reads a frozen quantized weight and has no gradient",
                op.name()
            ),
        ))
    }
}
