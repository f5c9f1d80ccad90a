//! AdamW on block-wise 8-bit moments ([`crate::ops::optimizer::quantize`]): each block of
//! [`BLOCK`] elements is dequantized, updated in f32 and quantized again to its new absmax.

use super::kernels::{AdamWStep, Store};
use crate::ops::optimizer::quantize::{nearest, normalize, signed_map, unsigned_map, BLOCK};
use rayon::prelude::*;

/// A moment stored in 8 bits: its codes (staged as their integer values) and one absmax per
/// block of [`BLOCK`] codes.
pub struct Quantized<'a> {
    pub codes: &'a mut [f32],
    pub absmax: &'a mut [f32],
}

/// One AdamW step ([`AdamWStep`]) in place with the first moment `m` quantized by the signed
/// dynamic map and the second `v` by the unsigned one: per block, `m = map[code] * absmax`,
/// the f32 update (the parameter from the unquantized new moments), then the new absmax =
/// max |moment| over the block and each code the nearest ([`nearest`]) to `moment / absmax`.
/// `optim.cu`'s `adamw8_kernel` computes the same values. A `grad_scale` of 0 skips the step.
pub fn adamw8_update(
    p: &mut [f32],
    g: &[f32],
    (m, v): (Quantized, Quantized),
    step: &AdamWStep,
    store: Store,
) {
    if step.grad_scale == 0.0 {
        return;
    }
    let (sm, um) = (signed_map(), unsigned_map());
    let b = BLOCK as usize;
    p.par_chunks_mut(b)
        .zip(g.par_chunks(b))
        .zip(m.codes.par_chunks_mut(b).zip(m.absmax.par_iter_mut()))
        .zip(v.codes.par_chunks_mut(b).zip(v.absmax.par_iter_mut()))
        .enumerate()
        .for_each(|(k, (((p, g), (mc, ma)), (vc, va)))| {
            let (mut max_m, mut max_v) = (0f32, 0f32);
            let mut moments = Vec::with_capacity(p.len());
            for (j, (p, &g)) in p.iter_mut().zip(g).enumerate() {
                let mi = sm[mc[j] as usize] * *ma;
                let vi = um[vc[j] as usize] * *va;
                let (pn, mn, vn) = step.apply(*p, g, mi, vi);
                *p = store.value(pn, k * b + j);
                max_m = max_m.max(mn.abs());
                max_v = max_v.max(vn.abs());
                moments.push((mn, vn));
            }
            for (j, (mn, vn)) in moments.into_iter().enumerate() {
                mc[j] = f32::from(nearest(sm, normalize(mn, max_m)));
                vc[j] = f32::from(nearest(um, normalize(vn, max_v)));
            }
            (*ma, *va) = (max_m, max_v);
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::optimizer::quantize::zero_code;
    use crate::ops::optimizer::{AdamWParams, Rounding};

    /// Runs `steps` steps on `n` elements with fp32 and with 8-bit moments from the same
    /// gradients; returns the largest parameter difference and the largest parameter change.
    fn compare(n: usize, steps: u64) -> (f32, f32) {
        let params = AdamWParams {
            lr: 1e-2,
            ..AdamWParams::default()
        };
        let store = Store::new(Rounding::Nearest, 0);
        let p0: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let (mut p32, mut p8) = (p0.clone(), p0.clone());
        let (mut m, mut v) = (vec![0f32; n], vec![0f32; n]);
        let blocks = n.div_ceil(BLOCK as usize);
        let mut mc = vec![f32::from(zero_code(signed_map())); n];
        let mut vc = vec![f32::from(zero_code(unsigned_map())); n];
        let (mut ma, mut va) = (vec![0f32; blocks], vec![0f32; blocks]);
        for t in 1..=steps {
            let g: Vec<f32> = (0..n)
                .map(|i| ((i as u64 * 7 + t * 13) as f32 * 0.11).cos())
                .collect();
            let step = AdamWStep::new(&params, t, 1.0);
            super::super::kernels::adamw_update(&mut p32, &g, &mut m, &mut v, &step, store);
            let moments = (
                Quantized {
                    codes: &mut mc,
                    absmax: &mut ma,
                },
                Quantized {
                    codes: &mut vc,
                    absmax: &mut va,
                },
            );
            adamw8_update(&mut p8, &g, moments, &step, store);
        }
        let diff = p32.iter().zip(&p8).map(|(a, b)| (a - b).abs());
        let moved = p32.iter().zip(&p0).map(|(a, b)| (a - b).abs());
        (diff.fold(0.0, f32::max), moved.fold(0.0, f32::max))
    }

    #[test]
    fn eight_bit_moments_track_fp32_moments() {
        // Two full blocks and a partial one; the parameters move by up to 10 * lr.
        let (diff, moved) = compare(2 * 2048 + 100, 10);
        assert!(moved > 0.02, "{moved}");
        assert!(
            diff < 0.1 * moved,
            "8-bit moments moved the parameters {diff} away ({moved})"
        );
    }
}
