//! Backward rules (vector-Jacobian products as graph ops) of the pointwise ops.

use crate::ir::{Op, ValueId};
use crate::ops::backward::Backward;
use crate::passes::autodiff::Rewriter;
use crate::passes::StageError;

impl Backward for super::Family {
    fn vjp(
        &self,
        _op: &Op,
        rw: &mut Rewriter,
        y: ValueId,
        dy: ValueId,
        wants: &[bool],
    ) -> Result<Vec<Option<ValueId>>, StageError> {
        rw.vjp_legacy(y, dy, wants)
    }
}
