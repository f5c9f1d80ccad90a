//! Shape and dtype rule, cost and precision class of the pointwise ops.

use crate::ir::{broadcast, BinaryFn, DType, Op, TensorType, UnaryFn};
use crate::ops::rules::{
    arity, elementwise_flops, fail, float, foreign, same_dtype, same_shape, Behaviour,
    PrecisionClass, Result, Rules,
};

impl Rules for super::Family {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
        match op {
            Op::Unary(_) | Op::Affine { .. } | Op::Clamp(_) => {
                arity(op, inputs, 1, 1)?;
                float(inputs[0], "operand")?;
                Ok(inputs[0].clone())
            }
            Op::UnaryBackward(_) | Op::UnaryOutputBackward(_) | Op::ClampBackward(_) => {
                arity(op, inputs, 2, 2)?;
                same_shape(inputs[0], inputs[1], op.name())?;
                float(inputs[0], "operand")?;
                Ok(inputs[0].clone())
            }
            Op::UnaryPair(_) => {
                arity(op, inputs, 2, 2)?;
                same_shape(inputs[0], inputs[1], op.name())?;
                float(inputs[0], "operand")?;
                let (x, n) = (inputs[0], inputs[0].numel());
                let (_, len) = crate::ops::packed_pair(n, n, x.dtype.size());
                Ok(TensorType::new(x.dtype, vec![len as usize]))
            }
            Op::Binary(f) => {
                arity(op, inputs, 2, 2)?;
                let [a, b] = [inputs[0], inputs[1]];
                match promoted(*f, a, b) {
                    Some(dtype) => Ok(TensorType::new(dtype, broadcast_pair(a, b)?)),
                    None => broadcast_all(inputs),
                }
            }
            Op::Where => {
                arity(op, inputs, 3, 3)?;
                broadcast_all(inputs)
            }
            _ => foreign(op, "pointwise"),
        }
    }

    fn flops(&self, op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
        match op {
            Op::Unary(_) | Op::UnaryBackward(_) | Op::UnaryOutputBackward(_) => 4 * out.numel(),
            Op::UnaryPair(_) => 8 * inputs.first().map_or(0, |x| x.numel()),
            Op::Clamp(_) | Op::ClampBackward(_) => 2 * out.numel(),
            _ => elementwise_flops(inputs, out),
        }
    }

    fn behaviour(&self, op: &Op) -> Behaviour {
        match op {
            // autocast's fp32 list (softplus among them, as torch.autocast runs it).
            Op::Unary(
                UnaryFn::Exp
                | UnaryFn::Log
                | UnaryFn::Sqrt
                | UnaryFn::Rsqrt
                | UnaryFn::Softplus
                | UnaryFn::Reciprocal,
            ) => Behaviour::CHEAP.in_precision(PrecisionClass::Fp32),
            _ => Behaviour::CHEAP,
        }
    }
}

/// For arithmetic on a 16-bit float and an fp32 operand (`a f b`): fp32, the result's type,
/// the 16-bit operand widened exactly as it is read (PyTorch's type promotion;
/// `passes::promote` folds a widening cast into the op this way). `None` for equal dtypes,
/// any other pair, or a comparison, extremum or power.
fn promoted(f: BinaryFn, a: &TensorType, b: &TensorType) -> Option<DType> {
    let arithmetic = matches!(
        f,
        BinaryFn::Add | BinaryFn::Sub | BinaryFn::Mul | BinaryFn::Div
    );
    let narrow = |t: &TensorType| matches!(t.dtype, DType::BF16 | DType::F16);
    match (a.dtype, b.dtype) {
        _ if !arithmetic => None,
        (DType::F32, _) if narrow(b) => Some(DType::F32),
        (_, DType::F32) if narrow(a) => Some(DType::F32),
        _ => None,
    }
}

/// The common float dtype and broadcast shape of `inputs` (at least one).
fn broadcast_all(inputs: &[&TensorType]) -> Result<TensorType> {
    let first = inputs[0];
    float(first, "operand")?;
    let mut shape = first.shape.clone();
    for x in &inputs[1..] {
        same_dtype(first, x)?;
        shape = broadcast_pair(&TensorType::new(first.dtype, shape), x)?;
    }
    Ok(TensorType::new(first.dtype, shape))
}

/// The broadcast shape of `a` and `b`.
fn broadcast_pair(a: &TensorType, b: &TensorType) -> Result<Vec<usize>> {
    match broadcast(&a.shape, &b.shape) {
        Some(s) => Ok(s),
        None => fail(
            format!("shapes do not broadcast: {a} and {b}"),
            "dims must be equal or 1, aligned from the right",
        ),
    }
}
