//! The stage trait for backward rules.

use crate::ir::{Op, ValueId};
use crate::passes::autodiff::Rewriter;
use crate::passes::StageError;

/// Reverse-mode rule of a family's forward ops.
pub trait Backward {
    /// Appends to `rw` the input gradients of node `y` (whose op is `op`) given its output
    /// gradient `dy`; `None` where an input needs none or `wants` says it is not wanted.
    fn vjp(
        &self,
        op: &Op,
        rw: &mut Rewriter,
        y: ValueId,
        dy: ValueId,
        wants: &[bool],
    ) -> Result<Vec<Option<ValueId>>, StageError>;
}
