//! Batched matmul with numpy broadcasting of the batch dims and transposes through strides.
//! Every sum runs in a fixed order, so results are bitwise identical from run to run.

use rayon::prelude::*;

use crate::exec::kernels::gemm::{gemm, rm, rm_mut, rm_t};

/// Index of the matrix that output batch `idx` reads from an operand with batch dims `x_batch`,
/// under numpy broadcasting against the output batch dims `o_batch`.
fn batch_offset(idx: usize, o_batch: &[usize], x_batch: &[usize]) -> usize {
    let (mut rem, mut off, mut stride) = (idx, 0, 1);
    for (d, &od) in o_batch.iter().enumerate().rev() {
        let i = rem % od;
        rem /= od;
        if let Some(xd) = (d + x_batch.len()).checked_sub(o_batch.len()) {
            let xs = x_batch[xd];
            if xs != 1 {
                off += i * stride;
            }
            stride *= xs;
        }
    }
    off
}

/// Below this `m*k + k*n`, matrixmultiply runs single-threaded, so batches go to rayon instead.
const GEMM_THREAD_SIZE: usize = 1 << 15;

/// Batched matmul with numpy broadcasting of the batch dims (all dims but the last two).
///
/// `a_shape`/`b_shape` have rank >= 2 and may differ in rank (missing leading dims are 1). If
/// `ta`, A is stored `[..., k, m]` and used transposed as `[..., m, k]`; likewise `tb` means B
/// is stored `[..., n, k]`. `out_shape = broadcast(batch_a, batch_b) ++ [m, n]`. Transposes are
/// handled through strides (no copies) and `out` is fully overwritten. When B has no batch and A
/// is neither broadcast nor transposed, the batch is folded into one large GEMM.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    a: &[f32],
    a_shape: &[usize],
    ta: bool,
    b: &[f32],
    b_shape: &[usize],
    tb: bool,
    out: &mut [f32],
    out_shape: &[usize],
) {
    let (ar, br, or) = (a_shape.len(), b_shape.len(), out_shape.len());
    debug_assert!(ar >= 2 && br >= 2 && or >= 2);
    let (m, k) = if ta {
        (a_shape[ar - 1], a_shape[ar - 2])
    } else {
        (a_shape[ar - 2], a_shape[ar - 1])
    };
    let n = if tb { b_shape[br - 2] } else { b_shape[br - 1] };
    debug_assert_eq!(&out_shape[or - 2..], &[m, n]);
    let (a_batch, b_batch, o_batch) =
        (&a_shape[..ar - 2], &b_shape[..br - 2], &out_shape[..or - 2]);
    let batches: usize = o_batch.iter().product();
    let (a_mat, b_mat, o_mat) = (m * k, k * n, m * n);
    let a_view = |d| if ta { rm_t(d, m) } else { rm(d, k) };
    let b_view = |d| if tb { rm_t(d, k) } else { rm(d, n) };
    if o_mat == 0 || batches == 0 {
        return;
    }
    if !ta && b_batch.iter().product::<usize>() == 1 && a_batch.iter().product::<usize>() == batches
    {
        gemm(batches * m, k, n, rm(a, k), b_view(b), 0.0, rm_mut(out, n));
        return;
    }
    let job = |(idx, o): (usize, &mut [f32])| {
        let ao = batch_offset(idx, o_batch, a_batch) * a_mat;
        let bo = batch_offset(idx, o_batch, b_batch) * b_mat;
        let (av, bv) = (a_view(&a[ao..ao + a_mat]), b_view(&b[bo..bo + b_mat]));
        gemm(m, k, n, av, bv, 0.0, rm_mut(o, n));
    };
    let out = &mut out[..batches * o_mat];
    if batches > 1 && m * k + k * n < GEMM_THREAD_SIZE {
        out.par_chunks_mut(o_mat).enumerate().for_each(job);
    } else {
        out.chunks_mut(o_mat).enumerate().for_each(job);
    }
}

/// Adds `bias` to every row of `out` (rows of `bias.len()` elements), in f32 before the
/// output's one rounding, as cuBLASLt's bias epilogue does.
pub fn add_rows(out: &mut [f32], bias: &[f32]) {
    if bias.is_empty() {
        return;
    }
    out.par_chunks_mut(bias.len()).for_each(|row| {
        for (o, b) in row.iter_mut().zip(bias) {
            *o += b;
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

    fn naive_matmul(
        a: &[f32],
        ash: &[usize],
        ta: bool,
        b: &[f32],
        bsh: &[usize],
        tb: bool,
        osh: &[usize],
    ) -> Vec<f32> {
        let (ar, br, or) = (ash.len(), bsh.len(), osh.len());
        let (m, n) = (osh[or - 2], osh[or - 1]);
        let k = if ta { ash[ar - 2] } else { ash[ar - 1] };
        let batches: usize = osh[..or - 2].iter().product();
        let mut out = vec![0.0; batches * m * n];
        for bi in 0..batches {
            let ao = batch_offset(bi, &osh[..or - 2], &ash[..ar - 2]) * m * k;
            let bo = batch_offset(bi, &osh[..or - 2], &bsh[..br - 2]) * k * n;
            for i in 0..m {
                for j in 0..n {
                    let mut s = 0.0f64;
                    for p in 0..k {
                        let av = if ta {
                            a[ao + p * m + i]
                        } else {
                            a[ao + i * k + p]
                        };
                        let bv = if tb {
                            b[bo + j * k + p]
                        } else {
                            b[bo + p * n + j]
                        };
                        s += av as f64 * bv as f64;
                    }
                    out[(bi * m + i) * n + j] = s as f32;
                }
            }
        }
        out
    }

    fn check_matmul(
        rng: &mut Rng,
        ash: &[usize],
        ta: bool,
        bsh: &[usize],
        tb: bool,
        osh: &[usize],
    ) {
        let a = rng.vec(ash.iter().product());
        let b = rng.vec(bsh.iter().product());
        let want = naive_matmul(&a, ash, ta, &b, bsh, tb, osh);
        let mut out = vec![f32::NAN; want.len()];
        matmul(&a, ash, ta, &b, bsh, tb, &mut out, osh);
        assert_close(
            &out,
            &want,
            1e-5,
            &format!("matmul {ash:?} {ta} {bsh:?} {tb}"),
        );
    }

    #[test]
    fn matmul_transposes_and_broadcast() {
        let mut rng = Rng(0x9e3779b97f4a7c15);
        let (m, k, n) = (3, 5, 4);
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let ash = |bat: &[usize]| [bat, &if ta { [k, m] } else { [m, k] }].concat();
            let bsh = |bat: &[usize]| [bat, &if tb { [n, k] } else { [k, n] }].concat();
            check_matmul(&mut rng, &ash(&[2, 1]), ta, &bsh(&[3]), tb, &[2, 3, m, n]);
            check_matmul(&mut rng, &ash(&[]), ta, &bsh(&[]), tb, &[m, n]);
            check_matmul(&mut rng, &ash(&[2, 3]), ta, &bsh(&[]), tb, &[2, 3, m, n]);
            check_matmul(
                &mut rng,
                &ash(&[]),
                ta,
                &bsh(&[2, 1, 3]),
                tb,
                &[2, 1, 3, m, n],
            );
        }
        // Large enough for matrixmultiply's own threading, with a batch.
        check_matmul(
            &mut rng,
            &[2, 130, 70],
            true,
            &[2, 130, 90],
            false,
            &[2, 70, 90],
        );
        // k = 0 must still overwrite the output with zeros.
        let mut out = vec![f32::NAN; 6];
        matmul(&[], &[2, 0], false, &[], &[0, 3], false, &mut out, &[2, 3]);
        assert_eq!(out, vec![0.0; 6]);
    }
}
