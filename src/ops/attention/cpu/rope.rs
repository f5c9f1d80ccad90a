//! Rotary position embedding and its exact inverse (the backward).

use crate::exec::kernels::layout::par_chunks;

/// Rotary position embedding (LLaMA / HF "rotate_half" convention) on x: `[b, t, heads*head_dim]`:
/// for each head, the pairs `(i, i + head_dim/2)`, `i < head_dim/2`, at position p (the t index)
/// are rotated by the angle `p * base^(-2i/head_dim)` (computed in f64, applied in f32).
/// `inverse = true` rotates by the negative angle, which is the exact backward (transpose) of
/// the forward rotation. `head_dim` is even; `out` is fully overwritten.
#[allow(clippy::too_many_arguments)]
pub fn rope(
    x: &[f32],
    b: usize,
    t: usize,
    heads: usize,
    head_dim: usize,
    base: f32,
    inverse: bool,
    out: &mut [f32],
) {
    let (width, half) = (heads * head_dim, head_dim / 2);
    let sign = if inverse { -1.0 } else { 1.0 };
    par_chunks(&mut out[..b * t * width], width, |o, row| {
        let xr = &x[row * width..(row + 1) * width];
        let pos = (row % t) as f64;
        for i in 0..half {
            let freq = (base as f64).powf(-2.0 * i as f64 / head_dim as f64);
            let (s, c) = (pos * freq).sin_cos();
            let (s, c) = ((sign * s) as f32, c as f32);
            for h in 0..heads {
                let (lo, hi) = (h * head_dim + i, h * head_dim + i + half);
                o[lo] = xr[lo] * c - xr[hi] * s;
                o[hi] = xr[hi] * c + xr[lo] * s;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    //! Forward kernels are checked against naive references; backward kernels against central
    //! finite differences of `sum(forward(x) * r)` (f64 loss accumulation, eps 1e-2), with
    //! relative L2 error below 1e-2.
    use super::*;
    use crate::exec::kernels::testing::{assert_close, Rng};

    #[test]
    fn rope_matches_reference_and_inverse_undoes_it() {
        let (b, t, heads, hd, base) = (2, 5, 3, 6, 10000.0f32);
        let x = Rng(17).vec(b * t * heads * hd);
        let mut y = vec![f32::NAN; x.len()];
        rope(&x, b, t, heads, hd, base, false, &mut y);
        let mut want = vec![0.0; x.len()];
        for row in 0..b * t {
            for h in 0..heads {
                for i in 0..hd / 2 {
                    let ang = (row % t) as f64 / (base as f64).powf(2.0 * i as f64 / hd as f64);
                    let o = row * heads * hd + h * hd;
                    let (a, c) = (x[o + i] as f64, x[o + i + hd / 2] as f64);
                    want[o + i] = (a * ang.cos() - c * ang.sin()) as f32;
                    want[o + i + hd / 2] = (c * ang.cos() + a * ang.sin()) as f32;
                }
            }
        }
        assert_close(&y, &want, 1e-6, "rope forward");
        let mut back = vec![f32::NAN; x.len()];
        rope(&y, b, t, heads, hd, base, true, &mut back);
        assert_close(&back, &x, 1e-6, "rope inverse");
    }
}
