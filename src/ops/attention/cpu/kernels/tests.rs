//! Forward kernels are checked against naive references (a masked softmax over the full score
//! matrix, soft-capped where the geometry says); backward kernels against central finite differences of `sum(forward(x) * r)` (f64
//! loss accumulation, eps 1e-2), with relative L2 error below 1e-2; each without and with a
//! key mask, fully masked query rows included.
use super::*;
use crate::exec::kernels::testing::{assert_close, central_diff, dot, Rng};

fn naive_attention(g: &AttnGeom, x: Operands) -> Vec<f32> {
    let Operands { q, k, v, mask } = x;
    let (qw, kvw, hd) = (
        g.attn.heads * g.head_dim,
        g.attn.kv_heads * g.head_dim,
        g.head_dim,
    );
    let mut out = vec![0.0; g.b * g.t_q * qw];
    for b in 0..g.b {
        for h in 0..g.attn.heads {
            let kvh = h / (g.attn.heads / g.attn.kv_heads);
            // The full t_q x t_k score matrix.
            let s: Vec<Vec<f64>> = (0..g.t_q)
                .map(|i| {
                    (0..g.t_k)
                        .map(|j| {
                            // Hugging Face's mask: a later key, or one `window` or more
                            // positions back, with queries aligned to the last keys.
                            let at = i as isize + g.t_k as isize - g.t_q as isize;
                            let back = at - j as isize;
                            let far = g.attn.window.is_some_and(|w| back >= w as isize);
                            let masked = mask.is_some_and(|m| m[b * g.t_k + j] == 0);
                            if g.attn.causal && (back < 0 || far) || masked {
                                return f64::NEG_INFINITY;
                            }
                            let qo = (b * g.t_q + i) * qw + h * hd;
                            let ko = (b * g.t_k + j) * kvw + kvh * hd;
                            let s = (0..hd)
                                .map(|d| q[qo + d] as f64 * k[ko + d] as f64)
                                .sum::<f64>()
                                * g.attn.scale as f64;
                            // Gemma 2's soft cap, after the scale and before the mask.
                            g.attn
                                .softcap
                                .map_or(s, |c| c as f64 * (s / c as f64).tanh())
                        })
                        .collect()
                })
                .collect();
            for (i, row) in s.iter().enumerate() {
                let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                if max == f64::NEG_INFINITY {
                    // No key to attend: zeros.
                    continue;
                }
                let e: Vec<f64> = row.iter().map(|x| (x - max).exp()).collect();
                let z: f64 = e.iter().sum();
                for d in 0..hd {
                    let acc: f64 = (0..g.t_k)
                        .map(|j| e[j] / z * v[(b * g.t_k + j) * kvw + kvh * hd + d] as f64)
                        .sum();
                    out[(b * g.t_q + i) * qw + h * hd + d] = acc as f32;
                }
            }
        }
    }
    out
}

fn attn_geoms() -> Vec<AttnGeom> {
    let attn = AttnParams {
        heads: 4,
        kv_heads: 2,
        causal: false,
        scale: 0.7,
        window: None,
        softcap: None,
        key_mask: false,
    };
    let causal = AttnParams {
        causal: true,
        ..attn
    };
    let base = AttnGeom {
        b: 2,
        t_q: 5,
        t_k: 5,
        attn,
        head_dim: 3,
        operand: crate::ir::DType::F32,
    };
    vec![
        base,
        AttnGeom {
            attn: causal,
            ..base
        },
        AttnGeom {
            attn: causal,
            t_q: 3,
            t_k: 6,
            ..base
        },
        AttnGeom {
            attn: AttnParams {
                kv_heads: 4,
                ..attn
            },
            t_q: 4,
            t_k: 6,
            ..base
        },
        // Sliding windows shorter than the sequence, with grouped and with fewer queries
        // than keys.
        AttnGeom {
            attn: AttnParams {
                window: Some(2),
                softcap: None,
                ..causal
            },
            t_q: 7,
            t_k: 7,
            ..base
        },
        AttnGeom {
            attn: AttnParams {
                window: Some(3),
                softcap: None,
                ..causal
            },
            t_q: 4,
            t_k: 7,
            ..base
        },
        AttnGeom {
            attn: AttnParams {
                window: Some(1),
                softcap: None,
                ..causal
            },
            ..base
        },
        // Soft-capped scores, grouped and causal, and with a window.
        AttnGeom {
            attn: AttnParams {
                softcap: Some(0.5),
                ..causal
            },
            ..base
        },
        AttnGeom {
            attn: AttnParams {
                window: Some(3),
                softcap: Some(0.8),
                ..causal
            },
            t_q: 4,
            t_k: 7,
            ..base
        },
    ]
}

fn attn_inputs(g: &AttnGeom, rng: &mut Rng) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (qw, kvw) = (g.attn.heads * g.head_dim, g.attn.kv_heads * g.head_dim);
    (
        rng.vec(g.b * g.t_q * qw),
        rng.vec(g.b * g.t_k * kvw),
        rng.vec(g.b * g.t_k * kvw),
    )
}

/// The key masks each geometry is checked under: none, and one with padding at the end of
/// batch item 0 and a hole in it, and at the start of item 1 (under a causal mask its first
/// queries see only padding: fully masked rows).
fn key_masks(g: &AttnGeom) -> [Option<Vec<i32>>; 2] {
    let mask = (0..g.b * g.t_k)
        .map(|i| {
            let (b, j) = (i / g.t_k, i % g.t_k);
            let padding = if b % 2 == 0 {
                j + 2 >= g.t_k || j == 1
            } else {
                j < 3
            };
            i32::from(!padding)
        })
        .collect();
    [None, Some(mask)]
}

/// `g` reading a key mask when `mask` is given.
fn masked(g: &AttnGeom, mask: Option<&[i32]>) -> AttnGeom {
    AttnGeom {
        attn: AttnParams {
            key_mask: mask.is_some(),
            ..g.attn
        },
        ..*g
    }
}

fn ops<'a>(q: &'a [f32], k: &'a [f32], v: &'a [f32], mask: Option<&'a [i32]>) -> Operands<'a> {
    Operands { q, k, v, mask }
}

fn attn_fwd(g: &AttnGeom, x: Operands) -> Vec<f32> {
    let mut out = vec![f32::NAN; x.q.len()];
    attention_forward(g, x, &mut out);
    out
}

#[test]
fn attention_forward_matches_naive() {
    let mut rng = Rng(3);
    for g in attn_geoms() {
        let (q, k, v) = attn_inputs(&g, &mut rng);
        for mask in key_masks(&g) {
            let x = ops(&q, &k, &v, mask.as_deref());
            let g = masked(&g, mask.as_deref());
            let got = attn_fwd(&g, x);
            assert!(got.iter().all(|o| o.is_finite()), "{g:?}");
            assert_close(&got, &naive_attention(&g, x), 1e-5, &format!("{g:?}"));
        }
    }
}

#[test]
fn a_window_as_long_as_the_keys_is_plain_causal() {
    let mut rng = Rng(5);
    let g = attn_geoms()[1];
    let (q, k, v) = attn_inputs(&g, &mut rng);
    let x = ops(&q, &k, &v, None);
    for w in [g.t_k, g.t_k + 3] {
        let windowed = AttnGeom {
            attn: AttnParams {
                window: Some(w),
                softcap: None,
                ..g.attn
            },
            ..g
        };
        assert_eq!(attn_fwd(&windowed, x), attn_fwd(&g, x));
    }
}

/// A mask of all ones is no mask, bit for bit.
#[test]
fn a_mask_of_ones_changes_nothing() {
    let mut rng = Rng(9);
    for g in attn_geoms() {
        let (q, k, v) = attn_inputs(&g, &mut rng);
        let ones = vec![1; g.b * g.t_k];
        let x = ops(&q, &k, &v, None);
        let all = ops(&q, &k, &v, Some(&ones));
        let gm = masked(&g, Some(&ones));
        assert_eq!(attn_fwd(&gm, all), attn_fwd(&g, x));
        for (which, n) in [(AttnInput::Q, q.len()), (AttnInput::K, k.len())] {
            let grad = |g: &AttnGeom, x| {
                let mut d = vec![f32::NAN; n];
                attention_backward(g, x, &q, which, &mut d);
                d
            };
            assert_eq!(grad(&gm, all), grad(&g, x));
        }
    }
}

/// A batch item whose every key is padding outputs zeros and passes zero gradients to its
/// q, k and v, without NaN, and leaves the other item as it was alone.
#[test]
fn fully_masked_rows_give_zeros_and_zero_gradients() {
    let mut rng = Rng(11);
    for g in attn_geoms() {
        let (q, k, v) = attn_inputs(&g, &mut rng);
        let mask: Vec<i32> = (0..g.b * g.t_k).map(|i| i32::from(i < g.t_k)).collect();
        let x = ops(&q, &k, &v, Some(&mask));
        let gm = masked(&g, Some(&mask));
        let out = attn_fwd(&gm, x);
        let half = out.len() / g.b;
        assert!(out[half..].iter().all(|&o| o == 0.0), "{g:?}");
        let plain = attn_fwd(&g, ops(&q, &k, &v, None));
        assert_eq!(out[..half], plain[..half]);
        for (which, n) in [
            (AttnInput::Q, q.len()),
            (AttnInput::K, k.len()),
            (AttnInput::V, v.len()),
        ] {
            let mut d = vec![f32::NAN; n];
            attention_backward(&gm, x, &q, which, &mut d);
            let half = n / g.b;
            assert!(d[half..].iter().all(|&o| o == 0.0), "{which:?} {g:?}");
            assert!(d.iter().all(|o| o.is_finite()), "{which:?} {g:?}");
        }
    }
}

#[test]
fn attention_backward_matches_finite_differences() {
    let mut rng = Rng(13);
    for g in attn_geoms() {
        let (q, k, v) = attn_inputs(&g, &mut rng);
        let r = rng.vec(q.len());
        for mask in key_masks(&g) {
            let m = mask.as_deref();
            let g = masked(&g, m);
            let grad = |which, len| {
                let mut d = vec![f32::NAN; len];
                attention_backward(&g, ops(&q, &k, &v, m), &r, which, &mut d);
                d
            };
            let loss = |q: &[f32], k: &[f32], v: &[f32]| dot(&attn_fwd(&g, ops(q, k, v, m)), &r);
            let want_q = central_diff(&q, 1e-2, |x| loss(x, &k, &v));
            let want_k = central_diff(&k, 1e-2, |x| loss(&q, x, &v));
            let want_v = central_diff(&v, 1e-2, |x| loss(&q, &k, x));
            let at = |what| format!("{what} {g:?}");
            assert_close(&grad(AttnInput::Q, q.len()), &want_q, 1e-2, &at("dq"));
            assert_close(&grad(AttnInput::K, k.len()), &want_k, 1e-2, &at("dk"));
            assert_close(&grad(AttnInput::V, v.len()), &want_v, 1e-2, &at("dv"));
        }
    }
}

#[test]
fn attention_is_deterministic() {
    let g = AttnGeom {
        b: 3,
        t_q: 33,
        t_k: 33,
        attn: AttnParams {
            heads: 4,
            kv_heads: 1,
            causal: true,
            scale: 0.35,
            window: None,
            softcap: None,
            key_mask: false,
        },
        head_dim: 8,
        operand: crate::ir::DType::F32,
    };
    let (q, k, v) = attn_inputs(&g, &mut Rng(21));
    let x = ops(&q, &k, &v, None);
    let dk = || {
        let mut d = vec![0.0; k.len()];
        attention_backward(&g, x, &q, AttnInput::K, &mut d);
        d
    };
    assert_eq!(dk(), dk());
    assert_eq!(attn_fwd(&g, x), attn_fwd(&g, x));
}
