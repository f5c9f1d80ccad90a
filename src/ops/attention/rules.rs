//! Shape and dtype rule, cost and precision class of attention, its backward and rotary
//! position embedding.

use super::{AttnInput, AttnParams};
use crate::ir::{DType, Op, TensorType};
use crate::ops::rules::{
    arity, elementwise_flops, fail, float, foreign, rank_exactly, same_shape, Behaviour,
    PrecisionClass, Result, Rules,
};

/// Checks a key mask for queries `q[B, Tq, ..]` over keys `k[B, Tk, ..]`: i32 of shape
/// `[B, Tk]`. The front end calls it to point at the mask argument.
pub(crate) fn key_mask(q: &TensorType, k: &TensorType, mask: &TensorType) -> Result<()> {
    let want = [q.shape.first().copied(), k.shape.get(1).copied()];
    if mask.shape.len() != 2 || want != [Some(mask.shape[0]), Some(mask.shape[1])] {
        let [b, tk] = want.map(|d| d.map_or("?".to_string(), |d| d.to_string()));
        return fail(
            format!("attention key_mask {mask} must have shape [{b}, {tk}] (batch, keys)"),
            "pass one row per batch item with one entry per key, as `attention_mask`: \
             `input attention_mask: i32[B, T]`",
        );
    }
    if mask.dtype != DType::I32 {
        return fail(
            format!("attention key_mask must be i32, found {mask}"),
            "declare it as `input attention_mask: i32[B, T]` (1 attends, 0 is padding)",
        );
    }
    Ok(())
}

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

/// Checks the forward's inputs `q, k, v[, mask]` (as many as `a` takes, the caller checked).
fn forward(inputs: &[&TensorType], a: &AttnParams) -> Result<usize> {
    let dh = attention(inputs[0], inputs[1], inputs[2], a)?;
    if a.key_mask {
        key_mask(inputs[0], inputs[1], inputs[3])?;
    }
    Ok(dh)
}

/// `(q, k, v, dout[, mask]) -> d(which)`: the forward's operands, and `dout` of q's type.
fn attention_backward(
    inputs: &[&TensorType],
    a: &AttnParams,
    which: AttnInput,
) -> Result<TensorType> {
    let (q, k, v, dout) = (inputs[0], inputs[1], inputs[2], inputs[3]);
    let mut operands = vec![q, k, v];
    operands.extend(inputs.get(4));
    forward(&operands, a)?;
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

/// The q, k and v types of a packed attention operand `x[B, T, (heads + 2 kv_heads) * dh]`,
/// checked as the separate operands are: the columns it holds must split into those blocks.
pub(crate) fn unpacked(x: &TensorType, a: &AttnParams) -> Result<[TensorType; 3]> {
    rank_exactly(x, 3, "packed attention x")?;
    let blocks = a.heads + 2 * a.kv_heads;
    if a.heads == 0 || a.kv_heads == 0 || !x.shape[2].is_multiple_of(blocks) {
        return fail(
            format!(
                "packed attention x {x} does not split into {} q and 2 x {} k/v heads",
                a.heads, a.kv_heads
            ),
            "x's last dim must be (heads + 2 kv_heads) x head_dim: q, then k, then v",
        );
    }
    let dh = x.shape[2] / blocks;
    let part = |heads: usize| TensorType::new(x.dtype, vec![x.shape[0], x.shape[1], heads * dh]);
    let [q, k, v] = [part(a.heads), part(a.kv_heads), part(a.kv_heads)];
    attention(&q, &k, &v, a)?;
    Ok([q, k, v])
}

/// Checks a packed forward's inputs `x[, mask]` and returns q's type, the output's.
fn packed(inputs: &[&TensorType], a: &AttnParams) -> Result<TensorType> {
    let [q, k, _] = unpacked(inputs[0], a)?;
    if a.key_mask {
        key_mask(&q, &k, inputs[1])?;
    }
    Ok(q)
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
                arity(op, inputs, a.inputs(), a.inputs())?;
                forward(inputs, a)?;
                Ok(inputs[0].clone())
            }
            Op::AttentionBackward { attn, which } => {
                arity(op, inputs, attn.inputs() + 1, attn.inputs() + 1)?;
                attention_backward(inputs, attn, *which)
            }
            Op::PackedAttention(a) => {
                arity(op, inputs, a.packed_inputs(), a.packed_inputs())?;
                packed(inputs, a)
            }
            Op::PackedAttentionBackward(a) => {
                arity(op, inputs, a.packed_inputs() + 1, a.packed_inputs() + 1)?;
                let mut forward = vec![inputs[0]];
                forward.extend(inputs.get(2));
                let q = packed(&forward, a)?;
                if *inputs[1] != q {
                    return fail(
                        format!(
                            "packed attention gradient {} does not match q {q}",
                            inputs[1]
                        ),
                        "dout must have the type of the attention's output",
                    );
                }
                Ok(inputs[0].clone())
            }
            Op::Rope { heads, .. } => {
                arity(op, inputs, 1, 1)?;
                rope(inputs[0], *heads)
            }
            _ => foreign(op, "attention"),
        }
    }

    fn flops(&self, op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
        let (a, q, k) = match op {
            Op::Attention(a) | Op::AttentionBackward { attn: a, .. } => {
                (a, inputs[0].clone(), inputs[1].clone())
            }
            Op::PackedAttention(a) | Op::PackedAttentionBackward(a) => {
                let Ok([q, k, _]) = unpacked(inputs[0], a) else {
                    return 0;
                };
                (a, q, k)
            }
            _ => return elementwise_flops(inputs, out),
        };
        // Two products of q.k and p.v per visible pair, per head dim of each head. A key mask
        // is data: the pairs it hides are counted, as the kernels still visit them.
        let pairs = q.shape[0] as u64 * a.visible_pairs(q.shape[1], k.shape[1]);
        let fwd = 4 * pairs * q.shape[2] as u64;
        match op {
            Op::Attention(_) | Op::PackedAttention(_) => fwd,
            Op::AttentionBackward { .. } => fwd * 3 / 2,
            // The statistics (q.k, dout.v), dq (q.k, dout.v, ds.k), dk (q.k, dout.v, ds.q)
            // and dv (q.k, p.dout): ten products of the forward's two.
            _ => fwd * 5,
        }
    }

    fn behaviour(&self, op: &Op) -> Behaviour {
        match op {
            // The forward runs on tensor cores for 16-bit operands (`attention_mma.cu`).
            Op::Attention(_) => Behaviour::MMA.in_precision(PrecisionClass::Low),
            Op::Rope { .. } => Behaviour::CHEAP,
            // The backward runs on tensor cores for 16-bit operands (`attention_backward_mma.cu`),
            // its fp32 form as cuBLASLt GEMMs.
            _ => Behaviour::MMA_OR_LIBRARY,
        }
    }
}
