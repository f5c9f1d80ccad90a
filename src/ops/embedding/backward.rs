//! Backward rule of the embedding lookup: a scatter-add of the gradient into the table's rows
//! (none into the padding row).

use crate::ir::Op;
use crate::ops::backward::{Backward, Vjp};
use crate::passes::StageError;

impl Backward for super::Family {
    fn vjp(&self, op: &Op, cx: &mut Vjp<'_>) -> Result<(), StageError> {
        let (x, dy) = (cx.x, cx.dy);
        match op {
            &Op::Embedding { padding_idx } => cx.set(0, |rw| {
                let rows = rw.shape(x[0])[0];
                rw.add(Op::EmbeddingBackward { rows, padding_idx }, vec![x[1], dy])
            }),
            Op::EmbeddingBackward { .. } => Err(cx.not_forward(op)),
            _ => Err(cx.foreign(op, "embedding")),
        }
    }
}
