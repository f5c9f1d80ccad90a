//! Shape and dtype rule, cost and precision class of attention, its backward and rotary
//! position embedding.

use super::{AttnInput, AttnParams};
use crate::ir::{Op, TensorType};
use crate::ops::rules::{
    arity, elementwise_flops, fail, float, foreign, rank_exactly, same_shape, Behaviour,
    PrecisionClass, Result, Rules,
};

/// Checks attention's `q[B, T, H*dh]`, `k`, `v` `[B, S, KV*dh]` and returns the head dim.
fn attention(q: &TensorType, k: &TensorType, v: &TensorType, a: &AttnParams) -> Result<usize> {
    let (heads, kv) = (a.heads, a.kv_heads);
    for (t, what) in [(q, "q"), (k, "k"), (v, "v")] {
        rank_exactly(t, 3, &format!("attention {what}"))?;
        float(t, &format!("attention {what}"))?;
    }
    same_shape(k, v, "attention k/v")?;
    if heads == 0 || kv == 0 || !heads.is_multiple_of(kv) || !q.shape[2].is_multiple_of(heads) {
        return fail(
            format!("attention with {heads} heads and {kv} kv heads does not divide q {q}"),
            "heads must divide the model width, and kv_heads must divide heads",
        );
    }
    match a.window {
        Some(0) => return fail("attention window 0 sees no key", "a window is at least 1"),
        Some(w) if !a.causal => {
            return fail(
                format!("attention window {w} without a causal mask"),
                "a window is only defined for causal attention",
            )
        }
        _ => {}
    }
    let dh = q.shape[2] / heads;
    if q.shape[0] != k.shape[0] || k.shape[2] != kv * dh {
        return fail(
            format!(
                "attention shapes disagree: q {q}, k {k} (expected k width {})",
                kv * dh
            ),
            "k and v need batch of q and kv_heads x head_dim columns",
        );
    }
    Ok(dh)
}

/// `(q, k, v, dout) -> d(which)`: the forward's operands, and `dout` of q's type.
fn attention_backward(
    inputs: &[&TensorType],
    a: &AttnParams,
    which: AttnInput,
) -> Result<TensorType> {
    let (q, k, v, dout) = (inputs[0], inputs[1], inputs[2], inputs[3]);
    attention(q, k, v, a)?;
    if dout != q {
        return fail(
            format!("attention gradient {dout} does not match q {q}"),
            "dout must have q's type",
        );
    }
    Ok(match which {
        AttnInput::Q => q.clone(),
        AttnInput::K => k.clone(),
        AttnInput::V => v.clone(),
    })
}

/// Rope over `x[B, T, heads*dh]` with an even head dim.
fn rope(x: &TensorType, heads: usize) -> Result<TensorType> {
    rank_exactly(x, 3, "rope input")?;
    float(x, "rope input")?;
    if heads == 0 || !x.shape[2].is_multiple_of(heads) || !(x.shape[2] / heads).is_multiple_of(2) {
        return fail(
            format!("rope with {heads} heads needs an even head dim dividing {x}"),
            "heads must divide the width into even head dims",
        );
    }
    Ok(x.clone())
}

impl Rules for super::Family {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
        match op {
            Op::Attention(a) => {
                arity(op, inputs, 3, 3)?;
                attention(inputs[0], inputs[1], inputs[2], a)?;
                Ok(inputs[0].clone())
            }
            Op::AttentionBackward { attn, which } => {
                arity(op, inputs, 4, 4)?;
                attention_backward(inputs, attn, *which)
            }
            Op::Rope { heads, .. } => {
                arity(op, inputs, 1, 1)?;
                rope(inputs[0], *heads)
            }
            _ => foreign(op, "attention"),
        }
    }

    fn flops(&self, op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
        let (Op::Attention(a) | Op::AttentionBackward { attn: a, .. }) = op else {
            return elementwise_flops(inputs, out);
        };
        let (q, k) = (inputs[0], inputs[1]);
        // Two products of q.k and p.v per visible pair, per head dim of each head.
        let pairs = q.shape[0] as u64 * a.visible_pairs(q.shape[1], k.shape[1]);
        let fwd = 4 * pairs * q.shape[2] as u64;
        if matches!(op, Op::Attention(_)) {
            fwd
        } else {
            fwd * 3 / 2
        }
    }

    fn behaviour(&self, op: &Op) -> Behaviour {
        match op {
            Op::Attention(_) => Behaviour::HEAVY.in_precision(PrecisionClass::Low),
            Op::Rope { .. } => Behaviour::CHEAP,
            // The backward's products are cuBLASLt GEMMs.
            _ => Behaviour::LIBRARY_GEMM,
        }
    }
}
