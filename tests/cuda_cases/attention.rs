//! Attention's op cases: the forward and the three gradients, grouped-query and causal, a
//! head dim of 256, and sliding windows shorter than a key tile and spanning several tiles
//! and several backward units of rows.

use super::t;
use memc::ir::*;

/// The attention cases, as `super::cases` lists them.
pub fn cases() -> Vec<(&'static str, Op, Vec<TensorType>)> {
    let f = |s: &[usize]| t(DType::F32, s);
    let attn = AttnParams {
        heads: 4,
        kv_heads: 2,
        causal: true,
        scale: 0.125,
        window: None,
    };
    let attn_bwd = |which| Op::AttentionBackward { attn, which };
    let attn_bwd_in = vec![
        f(&[2, 10, 64]),
        f(&[2, 12, 32]),
        f(&[2, 12, 32]),
        f(&[2, 10, 64]),
    ];
    let window = |attn: AttnParams, w| AttnParams {
        window: Some(w),
        ..attn
    };
    let attn_window_bwd = |w, which| Op::AttentionBackward {
        attn: window(attn, w),
        which,
    };
    // 80 rows in windowed units of 64: the second unit's keys start at 25.
    let attn_units_bwd = |which| Op::AttentionBackward {
        attn: AttnParams {
            heads: 2,
            kv_heads: 1,
            ..window(attn, 40)
        },
        which,
    };
    let attn_units_in = vec![
        f(&[1, 80, 32]),
        f(&[1, 80, 16]),
        f(&[1, 80, 16]),
        f(&[1, 80, 32]),
    ];
    vec![
        (
            "attention",
            Op::Attention(attn),
            vec![f(&[2, 10, 64]), f(&[2, 12, 32]), f(&[2, 12, 32])],
        ),
        (
            "attention_bwd_q",
            attn_bwd(AttnInput::Q),
            attn_bwd_in.clone(),
        ),
        (
            "attention_bwd_k",
            attn_bwd(AttnInput::K),
            attn_bwd_in.clone(),
        ),
        (
            "attention_bwd_v",
            attn_bwd(AttnInput::V),
            attn_bwd_in.clone(),
        ),
        (
            "attention_hd128",
            Op::Attention(AttnParams {
                heads: 2,
                kv_heads: 2,
                causal: false,
                scale: 0.088,
                window: None,
            }),
            vec![f(&[1, 33, 256]), f(&[1, 33, 256]), f(&[1, 33, 256])],
        ),
        // Sliding windows: shorter than one key tile (the first visible key past 0, key 0
        // seen by no query), and spanning several tiles and several backward units of rows.
        (
            "attention_window",
            Op::Attention(window(attn, 2)),
            vec![f(&[2, 10, 64]), f(&[2, 12, 32]), f(&[2, 12, 32])],
        ),
        (
            "attention_window_bwd_q",
            attn_window_bwd(2, AttnInput::Q),
            attn_bwd_in.clone(),
        ),
        (
            "attention_window_bwd_k",
            attn_window_bwd(2, AttnInput::K),
            attn_bwd_in.clone(),
        ),
        (
            "attention_window_bwd_v",
            attn_window_bwd(2, AttnInput::V),
            attn_bwd_in.clone(),
        ),
        (
            "attention_window_tiles",
            Op::Attention(AttnParams {
                heads: 2,
                kv_heads: 1,
                causal: true,
                scale: 0.088,
                window: Some(40),
            }),
            vec![f(&[1, 80, 256]), f(&[1, 80, 128]), f(&[1, 80, 128])],
        ),
        (
            "attention_window_units_bwd_q",
            attn_units_bwd(AttnInput::Q),
            attn_units_in.clone(),
        ),
        (
            "attention_window_units_bwd_k",
            attn_units_bwd(AttnInput::K),
            attn_units_in.clone(),
        ),
        (
            "attention_window_units_bwd_v",
            attn_units_bwd(AttnInput::V),
            attn_units_in.clone(),
        ),
    ]
}
