//! Shape and dtype rule, cost and precision class of the normalizations and their backward
//! ops, and the channel count their affine parameters have.

use super::NormKind;
use crate::ir::{Op, TensorType};
use crate::ops::rules::{
    arity, elementwise_flops, fail, first_numel, float, foreign, rank_at_least, same_shape,
    Behaviour, PrecisionClass, Result, Rules,
};

/// Channel count the affine parameters of a normalization have for input shape `x`.
pub fn norm_channels(kind: NormKind, x: &[usize]) -> usize {
    match kind {
        NormKind::Layer | NormKind::Rms => x.last().copied().unwrap_or(1),
        NormKind::Batch | NormKind::Group(_) => x.get(1).copied().unwrap_or(1),
    }
}

/// The channel count of a normalization of `x`, after checking that `x` has the axis the
/// parameters follow and, for group norm, that the groups divide the channels.
fn channels(kind: NormKind, x: &TensorType) -> Result<usize> {
    let min_rank = if matches!(kind, NormKind::Layer | NormKind::Rms) {
        1
    } else {
        2
    };
    rank_at_least(x, min_rank, "normalization input")?;
    let c = norm_channels(kind, &x.shape);
    if let NormKind::Group(g) = kind {
        if g == 0 || !c.is_multiple_of(g) {
            return fail(
                format!("groupnorm with {g} groups does not divide {c} channels of {x}"),
                "choose a group count that divides the channels",
            );
        }
    }
    Ok(c)
}

/// The forward rule: `x` floating, each parameter `[channels]`.
fn norm(kind: NormKind, x: &TensorType, params: &[&TensorType]) -> Result<TensorType> {
    float(x, "normalized input")?;
    let c = channels(kind, x)?;
    for p in params {
        if p.shape != [c] {
            return fail(
                format!("normalization parameter {p} does not match {c} channels of {x}"),
                format!("declare it with {c} channels"),
            );
        }
    }
    Ok(x.clone())
}

impl Rules for super::Family {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
        match op {
            Op::Norm { kind, .. } => {
                arity(op, inputs, 2, 3)?;
                norm(*kind, inputs[0], &inputs[1..])
            }
            Op::NormBackwardInput { kind, .. } => {
                arity(op, inputs, 3, 3)?;
                same_shape(inputs[0], inputs[2], op.name())?;
                norm(*kind, inputs[0], &inputs[1..2])
            }
            Op::NormBackwardWeight { kind, .. } => {
                arity(op, inputs, 2, 2)?;
                same_shape(inputs[0], inputs[1], op.name())?;
                let c = channels(*kind, inputs[0])?;
                Ok(TensorType::new(inputs[0].dtype, vec![c]))
            }
            Op::NormBackwardBias { kind } => {
                arity(op, inputs, 1, 1)?;
                let c = channels(*kind, inputs[0])?;
                Ok(TensorType::new(inputs[0].dtype, vec![c]))
            }
            _ => foreign(op, "norm"),
        }
    }

    fn flops(&self, op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
        match op {
            Op::NormBackwardBias { .. } => elementwise_flops(inputs, out),
            _ => 8 * first_numel(inputs),
        }
    }

    fn behaviour(&self, op: &Op) -> Behaviour {
        match op {
            // Batch and group norm run in their input's precision: statistics and arithmetic
            // in fp32, the output rounded once (autocast does so for batch_norm). A bf16
            // convolution net then saves the norms' bf16 inputs, not fp32 copies.
            Op::Norm {
                kind: NormKind::Batch | NormKind::Group(_),
                ..
            } => Behaviour::CHEAP,
            Op::Norm { .. } => Behaviour::CHEAP.in_precision(PrecisionClass::Fp32),
            _ => Behaviour::CHEAP,
        }
    }
}
