//! Packed attention's op cases: the forward and the one backward over q, k and v as column
//! blocks of one `x`, grouped-query and causal (tensor cores, and the GEMM path's key
//! accumulator across a group's heads), one head per kv head past a tile of query rows and
//! keys (the GEMM path's direct key gradients), and a window with a soft cap and a key mask.

use super::super::t;
use memc::ir::*;

/// The packed attention cases, as `super::cases` appends them.
pub fn cases() -> Vec<(&'static str, Op, Vec<TensorType>)> {
    let f = |s: &[usize]| t(DType::F32, s);
    let gqa = AttnParams {
        heads: 4,
        kv_heads: 2,
        causal: true,
        scale: 0.25,
        window: None,
        softcap: None,
        key_mask: false,
    };
    // Head dim 16: x [2, 12, (4 + 2 * 2) * 16].
    let gqa_x = f(&[2, 12, 128]);
    let gqa_dout = f(&[2, 12, 64]);
    // Two heads of 64 with their own kv heads over 80 rows: a partial second block and tile.
    let wide = AttnParams {
        heads: 2,
        kv_heads: 2,
        causal: false,
        scale: 0.125,
        ..gqa
    };
    let wide_x = f(&[1, 80, 384]);
    let wide_dout = f(&[1, 80, 128]);
    let capped = AttnParams {
        window: Some(3),
        softcap: Some(1.0),
        key_mask: true,
        scale: 0.5,
        ..gqa
    };
    let mask = t(DType::I32, &[3, 12]);
    let capped_x = f(&[3, 12, 128]);
    let capped_dout = f(&[3, 12, 64]);
    vec![
        (
            "packed_attention_gqa",
            Op::PackedAttention(gqa),
            vec![gqa_x.clone()],
        ),
        (
            "packed_attention_gqa_bwd",
            Op::PackedAttentionBackward(gqa),
            vec![gqa_x, gqa_dout],
        ),
        (
            "packed_attention_wide",
            Op::PackedAttention(wide),
            vec![wide_x.clone()],
        ),
        (
            "packed_attention_wide_bwd",
            Op::PackedAttentionBackward(wide),
            vec![wide_x, wide_dout],
        ),
        (
            "packed_attention_capped",
            Op::PackedAttention(capped),
            vec![capped_x.clone(), mask.clone()],
        ),
        (
            "packed_attention_capped_bwd",
            Op::PackedAttentionBackward(capped),
            vec![capped_x, capped_dout, mask],
        ),
    ]
}
