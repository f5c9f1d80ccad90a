//! The stage trait for backward rules, and the context a rule reads its node from and writes
//! its input gradients to.

use crate::ir::{Op, ValueId};
use crate::passes::autodiff::Rewriter;
use crate::passes::StageError;

/// Another form of a backward node: an op that computes bitwise the same value from other
/// inputs (a forward output instead of an input, say), so the plan may save whichever
/// forward values are cheaper to keep.
#[derive(Debug, Clone, PartialEq)]
pub struct Alternative {
    /// The backward node as its rule first built it.
    pub node: ValueId,
    /// The op of the other form; its output type equals the node's.
    pub op: Op,
    /// The inputs of the other form.
    pub inputs: Vec<ValueId>,
}

/// Reverse-mode rule of a family's forward ops.
pub trait Backward {
    /// Appends to `cx`'s rewriter the backward ops of the node `cx.y` (whose op is `op`) and
    /// records, through [`Vjp::set`], the gradient of each wanted input. An op that has no
    /// backward rule (a backward or optimizer op) is an internal error.
    fn vjp(&self, op: &Op, cx: &mut Vjp<'_>) -> Result<(), StageError>;
}

/// One node being differentiated: its inputs, output and output gradient, which of its
/// inputs want a gradient, and the gradients found so far.
pub struct Vjp<'a> {
    /// The node's output value.
    pub y: ValueId,
    /// The gradient of the loss with respect to `y`.
    pub dy: ValueId,
    /// The node's inputs, in order.
    pub x: &'a [ValueId],
    wants: &'a [bool],
    rw: &'a mut Rewriter,
    grads: Vec<Option<ValueId>>,
}

impl<'a> Vjp<'a> {
    /// A node with output `y`, output gradient `dy` and inputs `x`, of which input `i` wants
    /// a gradient where `wants[i]`; no gradient is recorded yet.
    pub fn new(
        rw: &'a mut Rewriter,
        y: ValueId,
        dy: ValueId,
        x: &'a [ValueId],
        wants: &'a [bool],
    ) -> Vjp<'a> {
        Vjp {
            y,
            dy,
            x,
            wants,
            rw,
            grads: vec![None; x.len()],
        }
    }

    /// The rewriter backward ops are added through.
    pub fn rw(&mut self) -> &mut Rewriter {
        self.rw
    }

    /// Records input `i`'s gradient as the value `build` adds, calling `build` only when
    /// input `i` wants a gradient (so no node is created otherwise).
    pub fn set(
        &mut self,
        i: usize,
        build: impl FnOnce(&mut Rewriter) -> Result<ValueId, StageError>,
    ) -> Result<(), StageError> {
        if self.wants.get(i).copied().unwrap_or(false) {
            let g = build(self.rw)?;
            if let Some(slot) = self.grads.get_mut(i) {
                *slot = Some(g);
            }
        }
        Ok(())
    }

    /// The gradient of each input, `None` where it needs none or wants none.
    pub fn into_grads(self) -> Vec<Option<ValueId>> {
        self.grads
    }

    /// The internal error for an op that has no backward rule (a backward or optimizer op).
    pub fn not_forward(&self, op: &Op) -> StageError {
        StageError::internal(
            "autodiff",
            format!(
                "{}: cannot differentiate `{}` (not a forward op)",
                self.y,
                op.name()
            ),
        )
    }

    /// The internal error for an op handed to a family that does not hold it.
    pub fn foreign(&self, op: &Op, family: &str) -> StageError {
        StageError::internal(
            "autodiff",
            format!("{}: `{}` is not a {family} op", self.y, op.name()),
        )
    }
}
