//! Selection kernels: `where` over three broadcast operands, and `clamp` with constant
//! bounds and its backward.

use rayon::prelude::*;

use crate::exec::kernels::layout::{broadcast_strides, for_rows, row_offset, CHUNK};
use crate::ir::Bounds;

/// One operand of `where`: its elements and shape.
pub type Operand<'a> = (&'a [f32], &'a [usize]);

/// Computes `out = cond != 0 ? a : b` with numpy broadcasting of all three operands to
/// `out_shape` (a NaN condition counts as nonzero).
pub fn select(cond: Operand, a: Operand, b: Operand, out: &mut [f32], out_shape: &[usize]) {
    debug_assert_eq!(out.len(), out_shape.iter().product::<usize>());
    let strides = [cond, a, b].map(|(_, shape)| broadcast_strides(shape, out_shape));
    let inner = strides.clone().map(|s| s.last().copied().unwrap_or(0));
    for_rows(out, out_shape, |r, row| {
        let [oc, oa, ob] = [0, 1, 2].map(|k| row_offset(r, out_shape, &strides[k]));
        for (t, o) in row.iter_mut().enumerate() {
            *o = if cond.0[oc + t * inner[0]] != 0.0 {
                a.0[oa + t * inner[1]]
            } else {
                b.0[ob + t * inner[2]]
            };
        }
    });
}

/// Computes `out[i] = clamp(x[i])` ([`Bounds::clamp`]).
pub fn clamp(bounds: Bounds, x: &[f32], out: &mut [f32]) {
    debug_assert_eq!(x.len(), out.len());
    out.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .for_each(|(o, x)| o.iter_mut().zip(x).for_each(|(o, &x)| *o = bounds.clamp(x)));
}

/// Computes `dx[i] = dy[i]` where the bounds pass `x[i]` ([`Bounds::passes`]), else 0.
pub fn clamp_backward(bounds: Bounds, x: &[f32], dy: &[f32], dx: &mut [f32]) {
    debug_assert_eq!(x.len(), dx.len());
    debug_assert_eq!(dy.len(), dx.len());
    dx.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK).zip(dy.par_chunks(CHUNK)))
        .for_each(|(d, (x, dy))| {
            for ((d, &x), &g) in d.iter_mut().zip(x).zip(dy) {
                *d = if bounds.passes(x) { g } else { 0.0 };
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_broadcasts_every_operand() {
        let cond = [1.0, 0.0, f32::NAN];
        let a = [10.0, 20.0];
        let b = [-1.0];
        let mut out = vec![0.0; 6];
        select((&cond, &[3]), (&a, &[2, 1]), (&b, &[]), &mut out, &[2, 3]);
        assert_eq!(out, [10.0, -1.0, 10.0, 20.0, -1.0, 20.0]);
    }

    #[test]
    fn clamp_keeps_nan_and_lets_hi_win() {
        let both = Bounds {
            lo: Some(-1.0),
            hi: Some(2.0),
        };
        let x = [-3.0, -1.0, 0.5, 2.0, 5.0, f32::NAN];
        let mut out = [0.0; 6];
        clamp(both, &x, &mut out);
        assert_eq!(&out[..5], &[-1.0, -1.0, 0.5, 2.0, 2.0]);
        assert!(out[5].is_nan());
        let mut dx = [0.0; 6];
        clamp_backward(both, &x, &[1.0; 6], &mut dx);
        assert_eq!(dx, [0.0, 1.0, 1.0, 1.0, 0.0, 0.0]);
        let crossed = Bounds {
            lo: Some(3.0),
            hi: Some(1.0),
        };
        assert_eq!(crossed.clamp(0.0), 1.0);
        assert_eq!(crossed.clamp(5.0), 1.0);
        let upper = Bounds {
            lo: None,
            hi: Some(0.0),
        };
        assert_eq!(upper.clamp(-7.0), -7.0);
    }
}
