//! Tensor types (dtype + shape), source spans, and numpy broadcasting.

use super::DType;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A byte range `[start, end)` in the `.mdl` source that produced an IR entity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Span {
    pub start: usize,
    pub end: usize,
}

impl Span {
    /// A span covering `start..end`.
    pub fn new(start: usize, end: usize) -> Span {
        Span { start, end }
    }

    /// The smallest span covering both.
    pub fn join(self, other: Span) -> Span {
        Span::new(self.start.min(other.start), self.end.max(other.end))
    }
}

/// The static type of a value: element type and dimensions (row-major, contiguous).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl TensorType {
    /// A tensor of `dtype` with `shape`.
    pub fn new(dtype: DType, shape: Vec<usize>) -> TensorType {
        TensorType { dtype, shape }
    }

    /// Number of elements (1 for a scalar of shape `[]`).
    pub fn numel(&self) -> u64 {
        numel(&self.shape)
    }

    /// Exact bytes of the tensor's storage.
    pub fn bytes(&self) -> u64 {
        self.numel().saturating_mul(self.dtype.size())
    }

    /// The same shape with another element type.
    pub fn with_dtype(&self, dtype: DType) -> TensorType {
        TensorType::new(dtype, self.shape.clone())
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, ShapeDisplay(&self.shape))
    }
}

/// Displays a shape as `[2, 3, 4]`.
pub struct ShapeDisplay<'a>(pub &'a [usize]);

impl fmt::Display for ShapeDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// Product of the dimensions, saturating at `u64::MAX` (inference rejects such tensors).
pub fn numel(shape: &[usize]) -> u64 {
    shape
        .iter()
        .fold(1u64, |acc, &d| acc.saturating_mul(d as u64))
}

/// The numpy broadcast of two shapes, or `None` when a pair of dims is neither equal nor 1.
pub fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let dim = |s: &[usize], i: usize| {
        if i + s.len() >= rank {
            s[i + s.len() - rank]
        } else {
            1
        }
    };
    (0..rank)
        .map(|i| match (dim(a, i), dim(b, i)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// Resolves a possibly negative axis against `rank`; `None` when out of range.
pub fn normalize_axis(axis: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    (0..r).contains(&a).then_some(a as usize)
}
