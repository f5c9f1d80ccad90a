//! Shape and dtype rule, cost and precision class of the data movement ops: reshape,
//! permute, slice, its zero-padding backward, and concat.

use crate::ir::{numel, DType, Op, ShapeDisplay, TensorType};
use crate::ops::rules::{
    arity, axis_below_rank, elementwise_flops, fail, float, foreign, same_dtype, Behaviour, Result,
    Rules,
};

fn reshape(x: &TensorType, shape: &[usize]) -> Result<TensorType> {
    if numel(shape) != x.numel() {
        return fail(
            format!(
                "cannot reshape {x} ({} elements) to {}",
                x.numel(),
                ShapeDisplay(shape)
            ),
            "the element count must stay the same",
        );
    }
    Ok(TensorType::new(x.dtype, shape.to_vec()))
}

/// Elements `offset .. offset + numel(shape)` of the 1-D `x`, as `shape`; with `dtype`, that
/// many elements of `dtype` from the byte where `x`'s element `offset` starts.
fn member(
    x: &TensorType,
    offset: usize,
    shape: &[usize],
    dtype: Option<DType>,
) -> Result<TensorType> {
    let t = dtype.unwrap_or(x.dtype);
    let start = offset as u64 * x.dtype.size();
    let inside = start + numel(shape) * t.size() <= x.bytes();
    if x.shape.len() != 1 || !inside || !start.is_multiple_of(t.size()) {
        return fail(
            format!(
                "cannot take {} elements of {t} at {offset} of {x}",
                ShapeDisplay(shape)
            ),
            "a member lies inside a flat tensor, aligned to its own element type",
        );
    }
    Ok(TensorType::new(t, shape.to_vec()))
}

fn permute(x: &TensorType, perm: &[usize]) -> Result<TensorType> {
    let rank = x.shape.len();
    let mut seen = vec![false; rank];
    let valid = perm.len() == rank
        && perm
            .iter()
            .all(|&p| p < rank && !std::mem::replace(&mut seen[p], true));
    if !valid {
        return fail(
            format!("{perm:?} is not a permutation of the {rank} dims of {x}"),
            "list every axis exactly once",
        );
    }
    let shape = perm.iter().map(|&p| x.shape[p]).collect();
    Ok(TensorType::new(x.dtype, shape))
}

fn slice(x: &TensorType, axis: usize, start: usize, end: usize) -> Result<TensorType> {
    match x.shape.get(axis) {
        Some(&d) if start < end && end <= d => {
            let mut shape = x.shape.clone();
            shape[axis] = end - start;
            Ok(TensorType::new(x.dtype, shape))
        }
        _ => fail(
            format!("slice {start}..{end} on axis {axis} is out of range for {x}"),
            "slice within the dim's extent",
        ),
    }
}

/// The zero tensor `x` is written into: integer tensors are not padded.
fn pad_slice(x: &TensorType, axis: usize, start: usize, full: usize) -> Result<TensorType> {
    let mut shape = x.shape.clone();
    match shape.get_mut(axis) {
        Some(d) if start + *d <= full => *d = full,
        _ => return fail(format!("pad_slice out of range for {x}"), "internal"),
    }
    float(x, "the input of `pad_slice`")?;
    Ok(TensorType::new(x.dtype, shape))
}

fn concat(parts: &[&TensorType], axis: usize) -> Result<TensorType> {
    let first = parts[0];
    axis_below_rank(first, axis, "concat ")?;
    let mut shape = first.shape.clone();
    shape[axis] = 0;
    for t in parts {
        same_dtype(first, t)?;
        let compatible = t.shape.len() == first.shape.len()
            && t.shape
                .iter()
                .zip(&first.shape)
                .enumerate()
                .all(|(i, (a, b))| i == axis || a == b);
        if !compatible {
            return fail(
                format!("concat along axis {axis}: {first} and {t} differ in another dim"),
                "all parts must agree except along the concat axis",
            );
        }
        shape[axis] += t.shape[axis];
    }
    Ok(TensorType::new(first.dtype, shape))
}

impl Rules for super::Family {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
        match op {
            Op::Concat { axis } => {
                arity(op, inputs, 1, usize::MAX)?;
                concat(inputs, *axis)
            }
            Op::Reshape { shape } => {
                arity(op, inputs, 1, 1)?;
                reshape(inputs[0], shape)
            }
            Op::Member {
                offset,
                shape,
                dtype,
            } => {
                arity(op, inputs, 1, 1)?;
                member(inputs[0], *offset, shape, *dtype)
            }
            Op::Permute { perm } => {
                arity(op, inputs, 1, 1)?;
                permute(inputs[0], perm)
            }
            Op::Slice { axis, start, end } => {
                arity(op, inputs, 1, 1)?;
                slice(inputs[0], *axis, *start, *end)
            }
            Op::PadSlice { axis, start, full } => {
                arity(op, inputs, 1, 1)?;
                pad_slice(inputs[0], *axis, *start, *full)
            }
            _ => foreign(op, "movement"),
        }
    }

    fn flops(&self, op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
        match op {
            Op::Reshape { .. } | Op::Member { .. } => 0,
            _ => elementwise_flops(inputs, out),
        }
    }

    fn behaviour(&self, _op: &Op) -> Behaviour {
        Behaviour::CHEAP
    }
}

#[cfg(test)]
mod tests {
    use super::member;
    use crate::ir::{DType, TensorType};

    #[test]
    fn a_member_of_another_type_takes_its_bytes_from_the_flat_elements_offset() {
        let flat = TensorType::new(DType::F32, vec![100]);
        // 64 bf16 elements from element 68's byte (272) fill 128 bytes up to byte 400.
        let copy = member(&flat, 68, &[8, 8], Some(DType::BF16)).expect("inside");
        assert_eq!(copy, TensorType::new(DType::BF16, vec![8, 8]));
        assert!(
            member(&flat, 69, &[8, 8], Some(DType::BF16)).is_err(),
            "past the end"
        );
        assert!(
            member(&flat, 68, &[8, 8], None).is_err(),
            "64 fp32 elements do not fit"
        );
        // An fp32 member of a bf16 flat tensor must start on a 4-byte boundary.
        let narrow = TensorType::new(DType::BF16, vec![100]);
        assert!(member(&narrow, 3, &[4], Some(DType::F32)).is_err());
        assert!(member(&narrow, 4, &[4], Some(DType::F32)).is_ok());
    }
}
