//! Backward rules of attention (one op per wanted operand: queries, keys, values; one op
//! writing all three for packed attention) and of the
//! rotary embedding (the inverse rotation of `dy`).

use crate::ir::{AttnInput, Op};
use crate::ops::backward::{Backward, Vjp};
use crate::passes::StageError;

impl Backward for super::Family {
    fn vjp(&self, op: &Op, cx: &mut Vjp<'_>) -> Result<(), StageError> {
        let (x, dy) = (cx.x, cx.dy);
        match op {
            Op::Attention(attn) => {
                // q, k, v, dout, then the key mask (which takes no gradient) if any.
                let mut inputs = vec![x[0], x[1], x[2], dy];
                inputs.extend(x.get(3));
                for (i, which) in [AttnInput::Q, AttnInput::K, AttnInput::V]
                    .into_iter()
                    .enumerate()
                {
                    cx.set(i, |rw| {
                        rw.add(Op::AttentionBackward { attn: *attn, which }, inputs.clone())
                    })?;
                }
                Ok(())
            }
            Op::PackedAttention(attn) => {
                // x, dout, then the key mask if any: one op writes dq | dk | dv.
                let mut inputs = vec![x[0], dy];
                inputs.extend(x.get(1));
                cx.set(0, |rw| rw.add(Op::PackedAttentionBackward(*attn), inputs))
            }
            Op::Rope {
                heads,
                base,
                inverse,
            } => cx.set(0, |rw| {
                rw.add(
                    Op::Rope {
                        heads: *heads,
                        base: *base,
                        inverse: !inverse,
                    },
                    vec![dy],
                )
            }),
            Op::AttentionBackward { .. } | Op::PackedAttentionBackward(_) => {
                Err(cx.not_forward(op))
            }
            _ => Err(cx.foreign(op, "attention")),
        }
    }
}
