//! Shape and dtype rule, cost and precision class of the optimizer updates and the
//! reductions they need (clipping, loss scaling, gradient accumulation). Every operand is
//! floating; the updates write their state in place and output an empty tensor.

use super::quantize::blocks;
use super::{adamw_states, AdamWParams, Rounding, StateFormat, MAX_GROUP};
use crate::ir::{DType, Op, OpClass, TensorType};
use crate::ops::rules::{
    arity, elementwise_flops, fail, first_numel, float, foreign, same_dtype, same_shape,
    scalar_f32, Behaviour, Result, Rules,
};

/// `(acc, grad)`: an f32 accumulator and a floating gradient of its shape.
fn accumulate(op: &Op, inputs: &[&TensorType], micro_steps: u32) -> Result<()> {
    if inputs[0].dtype != DType::F32 {
        return fail(
            format!("gradient accumulator {} must be f32", inputs[0]),
            "gradients accumulate in fp32",
        );
    }
    float(inputs[1], "an accumulated gradient")?;
    same_shape(inputs[0], inputs[1], op.name())?;
    if micro_steps == 0 {
        return fail(
            "gradient accumulation over 0 micro-steps",
            "accumulate over at least one micro-batch",
        );
    }
    Ok(())
}

/// `(param, grad, state..[, multiplier])` with `state` inputs (param and grad included)
/// before the multiplier, all of the parameter's shape but 8-bit AdamW's absmaxes; AdamW's
/// fp32 moments share a dtype, its 8-bit ones are u8 codes and f32 absmaxes, one per block.
/// Only a bf16 parameter is rounded stochastically.
fn update(op: &Op, inputs: &[&TensorType], state: usize, rounding: Rounding) -> Result<()> {
    arity(op, inputs, state, state + 1)?;
    for t in &inputs[1..state.min(4)] {
        same_shape(inputs[0], t, op.name())?;
    }
    match op {
        Op::AdamW(AdamWParams {
            state: StateFormat::Int8,
            ..
        }) => {
            let absmax = TensorType::new(DType::F32, vec![blocks(inputs[0].numel()) as usize]);
            for (k, t) in inputs[2..6].iter().enumerate() {
                let want = if k < 2 { DType::U8 } else { DType::F32 };
                if t.dtype != want || (k >= 2 && **t != absmax) {
                    return fail(
                        format!("8-bit AdamW state {t} is not u8 codes of the parameter's shape or {absmax} absmaxes"),
                        "the optimizer pass makes u8 codes and one f32 absmax per block",
                    );
                }
            }
        }
        Op::AdamW(_) => same_dtype(inputs[2], inputs[3])?,
        _ => {}
    }
    if rounding != Rounding::Nearest && inputs[0].dtype != DType::BF16 {
        return fail(
            format!("stochastic rounding of a {} parameter", inputs[0]),
            "only bf16 parameters (master_weights = off) are rounded stochastically",
        );
    }
    match inputs.get(state) {
        Some(m) => scalar_f32(m, "the update's multiplier"),
        None => Ok(()),
    }
}

/// `(p, g, m, v) x tensors [, multiplier]`: each quadruple as one fp32-moment AdamW reads
/// it, every quadruple of the first one's types (one kernel steps them all).
fn group(op: &Op, inputs: &[&TensorType], hyper: &AdamWParams, tensors: u32) -> Result<()> {
    let n = 4 * tensors as usize;
    let fp32_nearest = hyper.state == StateFormat::Fp32 && hyper.rounding == Rounding::Nearest;
    if tensors == 0 || tensors as usize > MAX_GROUP || !fp32_nearest {
        return fail(
            format!(
                "an AdamW group of {tensors} tensors ({:?} state, {:?})",
                hyper.state, hyper.rounding
            ),
            "a group steps 1 to 512 parameters with fp32 moments, rounded to nearest",
        );
    }
    arity(op, inputs, n, n + 1)?;
    let types = |q: &[&TensorType]| [q[0].dtype, q[1].dtype, q[2].dtype, q[3].dtype];
    for q in inputs[..n].chunks(4) {
        update(op, q, 4, Rounding::Nearest)?;
        same_dtype(q[2], q[3])?;
        if types(q) != types(&inputs[..4]) {
            return fail(
                format!("an AdamW group mixing {} and {}", q[0], inputs[0]),
                "every parameter of a group has the same types",
            );
        }
    }
    match inputs.get(n) {
        Some(m) => scalar_f32(m, "the update's multiplier"),
        None => Ok(()),
    }
}

/// The in-place inputs of an AdamW group of up to [`MAX_GROUP`] tensors: each
/// quadruple's parameter and moments.
const GROUP_SLOTS: [usize; 3 * MAX_GROUP] = {
    let mut slots = [0; 3 * MAX_GROUP];
    let mut k = 0;
    while k < MAX_GROUP {
        slots[3 * k] = 4 * k;
        slots[3 * k + 1] = 4 * k + 2;
        slots[3 * k + 2] = 4 * k + 3;
        k += 1;
    }
    slots
};

/// Whether `op` is AdamW on 8-bit moments.
fn eight_bit(op: &Op) -> bool {
    matches!(
        op,
        Op::AdamW(AdamWParams {
            state: StateFormat::Int8,
            ..
        })
    )
}

/// The type rule without the dtype check every optimizer op shares.
fn shape_rule(op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
    let scalar = TensorType::new(DType::F32, vec![]);
    let empty = TensorType::new(DType::F32, vec![0]);
    match op {
        Op::ClipCoefficient { scaled, .. } => {
            arity(op, inputs, 1 + usize::from(*scaled), usize::MAX)?;
            Ok(scalar)
        }
        Op::UnscaleGrads => {
            arity(op, inputs, 2, usize::MAX)?;
            scalar_f32(inputs[0], "the loss scale")?;
            Ok(scalar)
        }
        Op::AccumulateGrad { micro_steps } => {
            arity(op, inputs, 2, 2)?;
            accumulate(op, inputs, *micro_steps)?;
            Ok(empty)
        }
        Op::LossScaleUpdate { .. } => {
            arity(op, inputs, 3, 3)?;
            let names = ["the loss scale", "the clean-step count", "the multiplier"];
            for (t, what) in inputs.iter().zip(names) {
                scalar_f32(t, what)?;
            }
            Ok(empty)
        }
        Op::AdamW(p) => update(op, inputs, 2 + adamw_states(p.state), p.rounding).map(|()| empty),
        Op::AdamWGroup { hyper, tensors } => group(op, inputs, hyper, *tensors).map(|()| empty),
        Op::Sgd(p) => update(op, inputs, 3, p.rounding).map(|()| empty),
        _ => foreign(op, "optimizer"),
    }
}

impl Rules for super::Family {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
        let out = shape_rule(op, inputs)?;
        // 8-bit AdamW's codes (checked by the shape rule) are the only non-float operands.
        for t in inputs
            .iter()
            .filter(|t| t.dtype != DType::U8 || !eight_bit(op))
        {
            float(t, &format!("an operand of `{}`", op.name()))?;
        }
        Ok(out)
    }

    fn flops(&self, op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
        let first = first_numel(inputs);
        match op {
            Op::AccumulateGrad { .. } => 2 * first,
            Op::ClipCoefficient { .. } | Op::UnscaleGrads => {
                2 * inputs.iter().map(|t| t.numel()).sum::<u64>()
            }
            Op::AdamW(_) => 12 * first,
            Op::AdamWGroup { .. } => 12 * inputs.iter().step_by(4).map(|t| t.numel()).sum::<u64>(),
            Op::Sgd(_) => 4 * first,
            _ => elementwise_flops(inputs, out),
        }
    }

    fn behaviour(&self, op: &Op) -> Behaviour {
        let mutated_inputs: &'static [usize] = match op {
            Op::AdamW(_) if eight_bit(op) => &[0, 2, 3, 4, 5],
            Op::AdamW(_) => &[0, 2, 3],
            Op::AdamWGroup { tensors, .. } => {
                &GROUP_SLOTS[..3 * (*tensors as usize).min(MAX_GROUP)]
            }
            Op::Sgd(_) => &[0, 2],
            Op::LossScaleUpdate { .. } => &[0, 1],
            Op::AccumulateGrad { .. } => &[0],
            _ => &[],
        };
        Behaviour {
            class: OpClass::Update,
            mutated_inputs,
            ..Behaviour::CHEAP
        }
    }
}
