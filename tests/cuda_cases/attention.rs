//! Attention's op cases: the forward and the three gradients, grouped-query and causal, a
//! head dim of 256, sliding windows shorter than a key tile and spanning several tiles and
//! several backward units of rows, and key masks (`case_data` pads the end of batch item 0,
//! the start of item 1 and all of item 2) with causal and windowed masks and over a key tile
//! boundary, and soft-capped scores (grouped-query, causal and windowed with a key mask),
//! and few keys under many query rows (dk and dv split over the query tiles); then the
//! packed op's (`packed.rs`).

mod packed;

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
        softcap: None,
        key_mask: false,
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
        softcap: None,
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
    let masked = |attn: AttnParams| AttnParams {
        key_mask: true,
        ..attn
    };
    let mask = |b, tk| t(DType::I32, &[b, tk]);
    let with_mask = |mut inputs: Vec<TensorType>, b, tk| {
        inputs.push(mask(b, tk));
        inputs
    };
    let mask_bwd = |attn, which| Op::AttentionBackward {
        attn: masked(attn),
        which,
    };
    let mask_bwd_in = with_mask(
        vec![
            f(&[3, 10, 64]),
            f(&[3, 12, 32]),
            f(&[3, 12, 32]),
            f(&[3, 10, 64]),
        ],
        3,
        12,
    );
    // Head dim 64: key tiles of 64, so 80 keys of item 0 pad exactly the second tile.
    let tiles = AttnParams {
        heads: 2,
        kv_heads: 1,
        causal: false,
        scale: 0.125,
        window: None,
        softcap: None,
        key_mask: true,
    };
    let tiles_in = with_mask(
        vec![f(&[3, 80, 128]), f(&[3, 80, 64]), f(&[3, 80, 64])],
        3,
        80,
    );
    let mut tiles_bwd_in = tiles_in.clone();
    tiles_bwd_in.insert(3, f(&[3, 80, 128]));
    let masked_cases = vec![
        (
            "attention_mask",
            Op::Attention(masked(attn)),
            with_mask(
                vec![f(&[3, 10, 64]), f(&[3, 12, 32]), f(&[3, 12, 32])],
                3,
                12,
            ),
        ),
        (
            "attention_mask_bwd_q",
            mask_bwd(attn, AttnInput::Q),
            mask_bwd_in.clone(),
        ),
        (
            "attention_mask_bwd_k",
            mask_bwd(attn, AttnInput::K),
            mask_bwd_in.clone(),
        ),
        (
            "attention_mask_bwd_v",
            mask_bwd(attn, AttnInput::V),
            mask_bwd_in.clone(),
        ),
        (
            "attention_mask_window_bwd_k",
            mask_bwd(window(attn, 3), AttnInput::K),
            mask_bwd_in.clone(),
        ),
        ("attention_mask_tiles", Op::Attention(tiles), tiles_in),
        (
            "attention_mask_tiles_bwd_q",
            Op::AttentionBackward {
                attn: tiles,
                which: AttnInput::Q,
            },
            tiles_bwd_in.clone(),
        ),
        (
            "attention_mask_tiles_bwd_v",
            Op::AttentionBackward {
                attn: tiles,
                which: AttnInput::V,
            },
            tiles_bwd_in,
        ),
    ];
    let mut cases = vec![
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
                softcap: None,
                key_mask: false,
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
                softcap: None,
                key_mask: false,
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
    ];
    cases.extend(masked_cases);
    // Soft-capped scores, grouped-query: causal, and windowed with a key mask; scaled so that
    // the scores reach well past the cap and the probabilities stay far from uniform.
    let capped = AttnParams {
        scale: 0.5,
        softcap: Some(1.0),
        ..attn
    };
    let capped_window = masked(window(capped, 3));
    cases.push((
        "attention_softcap",
        Op::Attention(capped),
        vec![f(&[2, 10, 64]), f(&[2, 12, 32]), f(&[2, 12, 32])],
    ));
    cases.push((
        "attention_softcap_window",
        Op::Attention(capped_window),
        with_mask(
            vec![f(&[3, 10, 64]), f(&[3, 12, 32]), f(&[3, 12, 32])],
            3,
            12,
        ),
    ));
    for (which, name, wname) in [
        (
            AttnInput::Q,
            "attention_softcap_bwd_q",
            "attention_softcap_window_bwd_q",
        ),
        (
            AttnInput::K,
            "attention_softcap_bwd_k",
            "attention_softcap_window_bwd_k",
        ),
        (
            AttnInput::V,
            "attention_softcap_bwd_v",
            "attention_softcap_window_bwd_v",
        ),
    ] {
        let bwd = |attn| Op::AttentionBackward { attn, which };
        cases.push((name, bwd(capped), attn_bwd_in.clone()));
        cases.push((wname, bwd(capped_window), mask_bwd_in.clone()));
    }
    // Few keys (cross-attention to 40 of them) under 300 query rows: on tensor cores the dk
    // and dv of the one 64-key block split the 5 query tiles over 5 blocks.
    let cross = AttnParams {
        heads: 2,
        kv_heads: 1,
        causal: false,
        ..attn
    };
    let cross_in = vec![
        f(&[1, 300, 64]),
        f(&[1, 40, 32]),
        f(&[1, 40, 32]),
        f(&[1, 300, 64]),
    ];
    for (which, name) in [
        (AttnInput::K, "attention_cross_bwd_k"),
        (AttnInput::V, "attention_cross_bwd_v"),
    ] {
        let op = Op::AttentionBackward { attn: cross, which };
        cases.push((name, op, cross_in.clone()));
    }
    cases.extend(tile_cases());
    cases.extend(packed::cases());
    cases
}

/// Shapes past one tile of the tensor-core kernels (64 query rows a block, 64 or 32 keys a
/// tile), with partial last blocks and tiles: every mask, grouped-query heads of 64 with a
/// soft cap, and fewer queries than keys with heads of 128; the forward and each gradient.
fn tile_cases() -> Vec<(&'static str, Op, Vec<TensorType>)> {
    let f = |s: &[usize]| t(DType::F32, s);
    let masked = AttnParams {
        heads: 4,
        kv_heads: 2,
        causal: true,
        scale: 0.25,
        window: Some(90),
        softcap: Some(5.0),
        key_mask: true,
    };
    let cross = AttnParams {
        heads: 2,
        kv_heads: 1,
        causal: false,
        scale: 0.088,
        window: None,
        softcap: None,
        key_mask: false,
    };
    let masked_in = vec![
        f(&[2, 150, 256]),
        f(&[2, 150, 128]),
        f(&[2, 150, 128]),
        f(&[2, 150, 256]),
        t(DType::I32, &[2, 150]),
    ];
    let cross_in = vec![
        f(&[1, 70, 256]),
        f(&[1, 150, 128]),
        f(&[1, 150, 128]),
        f(&[1, 70, 256]),
    ];
    let forward = |inputs: &[TensorType]| {
        let mut v = inputs.to_vec();
        v.remove(3);
        v
    };
    let mut cases = vec![
        (
            "attention_tiles_masked",
            Op::Attention(masked),
            forward(&masked_in),
        ),
        (
            "attention_tiles_cross",
            Op::Attention(cross),
            forward(&cross_in),
        ),
    ];
    for (which, masked_name, cross_name) in [
        (
            AttnInput::Q,
            "attention_tiles_masked_bwd_q",
            "attention_tiles_cross_bwd_q",
        ),
        (
            AttnInput::K,
            "attention_tiles_masked_bwd_k",
            "attention_tiles_cross_bwd_k",
        ),
        (
            AttnInput::V,
            "attention_tiles_masked_bwd_v",
            "attention_tiles_cross_bwd_v",
        ),
    ] {
        let bwd = |attn| Op::AttentionBackward { attn, which };
        cases.push((masked_name, bwd(masked), masked_in.clone()));
        cases.push((cross_name, bwd(cross), cross_in.clone()));
    }
    cases
}
