//! What the passes' unit tests build their graphs from: an origin without span or scope,
//! and inputs of a given type.

use crate::ir::{DType, Graph, Op, Origin, Phase, Span, TensorType, ValueId};

/// An origin in `phase`, with no span and the top scope.
pub fn origin(phase: Phase) -> Origin {
    Origin {
        span: Span::default(),
        scope: String::new(),
        phase,
    }
}

/// Adds the input `name` of `dtype` and `shape` to `g` at `origin`.
pub fn input(
    g: &mut Graph,
    origin: &Origin,
    name: &str,
    (dtype, shape): (DType, &[usize]),
) -> ValueId {
    let ty = TensorType::new(dtype, shape.to_vec());
    let op = Op::Input {
        name: name.to_string(),
        ty,
    };
    g.add(op, vec![], origin).expect("input")
}
