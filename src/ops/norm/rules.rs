//! Shape and dtype rule, cost and precision class of the normalizations and their backward
//! ops, and the channel count their affine parameters have.

use super::NormKind;
use crate::ir::{DType, Op, OpClass, TensorType};
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

/// The running-statistics update's rule: `x` floating `[N, C, ...]` with more than one
/// value per channel (the unbiased variance divides by one less), both statistics fp32
/// `[C]`; the output is the empty tensor of an in-place step.
fn batch_norm_stats(inputs: &[&TensorType], momentum: f32) -> Result<TensorType> {
    let x = inputs[2];
    float(x, "batch norm input")?;
    let c = channels(NormKind::Batch, x)?;
    if !(0.0..=1.0).contains(&momentum) {
        return fail(
            format!("batch norm momentum {momentum} is outside [0, 1]"),
            "the running statistics move by this fraction of the batch's each step (PyTorch's default 0.1)",
        );
    }
    if x.numel() <= c as u64 {
        return fail(
            format!("batch norm in training needs more than one value per channel, found {x}"),
            "use a batch larger than 1 (or spatial dims), as torch.nn.BatchNorm requires",
        );
    }
    for t in &inputs[..2] {
        if t.shape != [c] || t.dtype != DType::F32 {
            return fail(
                format!("batch norm running statistic {t} does not match {c} channels of {x}"),
                format!("it is f32[{c}]"),
            );
        }
    }
    Ok(TensorType::new(DType::F32, vec![0]))
}

impl Rules for super::Family {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
        match op {
            Op::BatchNormStats { momentum } => {
                arity(op, inputs, 3, 3)?;
                batch_norm_stats(inputs, *momentum)
            }
            Op::Norm { kind, store, .. } => {
                arity(op, inputs, 2, 3)?;
                let y = norm(*kind, inputs[0], &inputs[1..])?;
                Ok(match store {
                    Some(low) => y.with_dtype(*low),
                    None => y,
                })
            }
            Op::AddNorm { kind, store, .. } => {
                arity(op, inputs, 3, 4)?;
                let (a, b) = (inputs[0], inputs[1]);
                same_shape(a, b, op.name())?;
                let wide = a.dtype == DType::F32 || b.dtype == DType::F32;
                if !(wide && a.dtype.is_float() && b.dtype.is_float()) {
                    return fail(
                        format!("{} adds {} and {}", op.name(), a.dtype, b.dtype),
                        "add floats, one of them fp32: the sum is stored in fp32",
                    );
                }
                if !matches!(kind, NormKind::Layer | NormKind::Rms) {
                    return fail(
                        format!("{} normalizes only with a layer or RMS norm", op.name()),
                        "keep the add and a batch or group norm as separate ops",
                    );
                }
                let sum = a.with_dtype(DType::F32);
                let y = norm(*kind, &sum, &inputs[2..])?;
                let t = store.unwrap_or(DType::F32);
                if !t.is_float() {
                    return fail(
                        format!("{} stores its norm in {t}", op.name()),
                        "store it in a floating type",
                    );
                }
                let (_, len) = super::add_norm_at(y.numel(), t.size());
                Ok(TensorType::new(DType::F32, vec![len as usize]))
            }
            Op::NormBackwardInput { kind, .. } => {
                // A fourth input is a gradient the op adds to its own as it stores it
                // (`passes::norm_accumulate`), of the input's shape.
                arity(op, inputs, 3, 4)?;
                same_shape(inputs[0], inputs[2], op.name())?;
                if let Some(acc) = inputs.get(3) {
                    same_shape(inputs[0], acc, op.name())?;
                }
                norm(*kind, inputs[0], &inputs[1..2])
            }
            Op::NormBackwardWeight { kind, .. } => {
                arity(op, inputs, 2, 2)?;
                same_shape(inputs[0], inputs[1], op.name())?;
                let c = channels(*kind, inputs[0])?;
                Ok(TensorType::new(inputs[0].dtype, vec![c]))
            }
            Op::NormBackward {
                kind,
                bias,
                sum,
                copy,
                ..
            } => {
                arity(op, inputs, 3, 4)?;
                if !matches!(kind, NormKind::Layer | NormKind::Rms) {
                    return fail(
                        format!("{} merges only layer and RMS norm gradients", op.name()),
                        "keep the batch and group norm gradients as separate ops",
                    );
                }
                let x = inputs[0];
                same_shape(x, inputs[2], op.name())?;
                if let Some(acc) = inputs.get(3) {
                    same_shape(x, acc, op.name())?;
                }
                norm(*kind, x, &inputs[1..2])?;
                let c = channels(*kind, x)? as u64;
                if let Some(t) = sum.or(*copy).filter(|t| !t.is_float()) {
                    return fail(
                        format!("{} rounds its input gradient to {t}", op.name()),
                        "round it to a floating type",
                    );
                }
                if let Some(t) = copy.filter(|t| t.size() >= x.dtype.size()) {
                    return fail(
                        format!("{} copies its {} input gradient to {t}", op.name(), x.dtype),
                        "copy it only to a narrower type",
                    );
                }
                if let (Some(s), Some(t)) = (sum, copy.filter(|t| Some(*t) != *sum)) {
                    return fail(
                        format!(
                            "{} sums its input gradient in {s} but copies it in {t}",
                            op.name()
                        ),
                        "round the sum and the copy to one type",
                    );
                }
                let rows = x.numel() / c.max(1);
                let copy_bytes = copy.map(|t| t.size());
                let at = super::GradsLayout::new(
                    (rows, c, x.dtype.size()),
                    *bias,
                    sum.is_some(),
                    copy_bytes,
                );
                Ok(TensorType::new(x.dtype, vec![at.len as usize]))
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
            // The input gradient's and the weight's, and a sum of dy for the bias.
            Op::NormBackward {
                bias, sum, copy, ..
            } => {
                let parts = [*bias, sum.is_some(), copy.is_some()].map(u64::from);
                (10 + parts.iter().sum::<u64>()) * first_numel(inputs)
            }
            Op::BatchNormStats { .. } => 3 * inputs.get(2).map_or(0, |x| x.numel()),
            // The add's, then the norm's.
            Op::AddNorm { .. } => 9 * first_numel(inputs),
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
            // Writes the two fp32 running statistics in place, reading `x` as it is (fp32
            // sums); never recomputed.
            Op::BatchNormStats { .. } => Behaviour {
                class: OpClass::Update,
                mutated_inputs: &[0, 1],
                ..Behaviour::CHEAP.in_precision(PrecisionClass::AsIs)
            },
            _ => Behaviour::CHEAP,
        }
    }
}
