//! Loss kernels: mean cross-entropy against range-checked integer targets, mean squared
//! error, and their backwards.

use rayon::prelude::*;

use crate::exec::kernels::check_ids;
use crate::exec::kernels::softmax::{logsumexp, softmax};
use crate::exec::ExecError;

/// Rows per parallel task of the cross-entropy forward.
const ROWS_PER_TASK: usize = 64;

/// Writes the mean cross-entropy of `logits` [n, classes] against integer `targets` [n] in
/// `0..classes` into the 1-element `out` (0 when n = 0). Errs on a target out of range.
pub fn cross_entropy(
    logits: &[f32],
    classes: usize,
    targets: &[i32],
    out: &mut [f32],
) -> Result<(), ExecError> {
    check_ids(targets, classes)?;
    // Fixed-size row blocks summed in parallel, then the partials in order: deterministic.
    let partials: Vec<f64> = targets
        .par_chunks(ROWS_PER_TASK)
        .enumerate()
        .map(|(blk, ts)| {
            let rows = logits[blk * ROWS_PER_TASK * classes..].chunks(classes.max(1));
            ts.iter()
                .zip(rows)
                .map(|(&t, row)| f64::from(logsumexp(row) - row[t as usize]))
                .sum()
        })
        .collect();
    let total: f64 = partials.iter().sum();
    out[0] = if targets.is_empty() {
        0.0
    } else {
        (total / targets.len() as f64) as f32
    };
    Ok(())
}

/// Writes `dlogits = (softmax(logits) - onehot(target)) * dloss / n`. Errs on a target out of
/// range (dlogits is then unspecified).
pub fn cross_entropy_backward(
    logits: &[f32],
    classes: usize,
    targets: &[i32],
    dloss: f32,
    dlogits: &mut [f32],
) -> Result<(), ExecError> {
    check_ids(targets, classes)?;
    if classes == 0 || targets.is_empty() {
        return Ok(());
    }
    softmax(logits, &[targets.len(), classes], 1, dlogits);
    let scale = dloss / targets.len() as f32;
    dlogits
        .par_chunks_mut(classes)
        .zip(targets.par_iter())
        .for_each(|(row, &t)| {
            row[t as usize] -= 1.0;
            row.iter_mut().for_each(|v| *v *= scale);
        });
    Ok(())
}

/// Writes the mean of `(a - b)^2` over all elements (f64 accumulation, 0 when empty) into the
/// 1-element `out`.
pub fn mse(a: &[f32], b: &[f32], out: &mut [f32]) {
    debug_assert_eq!(a.len(), b.len());
    let sum: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    out[0] = if a.is_empty() {
        0.0
    } else {
        (sum / a.len() as f64) as f32
    };
}

/// Writes the gradient w.r.t. `a` of `mse(a, b) * dloss`: `2 * (a - b) / n * dloss` (the
/// gradient w.r.t. `b` is its negation; the caller negates).
pub fn mse_backward(a: &[f32], b: &[f32], dloss: f32, da: &mut [f32]) {
    let scale = 2.0 * dloss / a.len().max(1) as f32;
    da.par_iter_mut()
        .zip(a.par_iter().zip(b))
        .for_each(|(d, (x, y))| *d = (x - y) * scale);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::kernels::testing::{central_diff, rel_err, Rng};

    #[test]
    fn cross_entropy_matches_naive() -> Result<(), ExecError> {
        let logits: Vec<f32> = Rng(1).vec(12).iter().map(|v| v * 30.0).collect();
        let targets = [0, 3, 2];
        let mut out = [f32::NAN];
        cross_entropy(&logits, 4, &targets, &mut out)?;
        let want: f64 = (0..3)
            .map(|r| {
                let row: Vec<f64> = logits[r * 4..r * 4 + 4]
                    .iter()
                    .map(|&v| f64::from(v))
                    .collect();
                let m = row.iter().copied().fold(f64::MIN, f64::max);
                m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln() - row[targets[r] as usize]
            })
            .sum::<f64>()
            / 3.0;
        assert!((f64::from(out[0]) - want).abs() < 1e-4, "{} {want}", out[0]);
        Ok(())
    }

    /// Tolerance: relative L2 error 1e-2 against h = 1e-2 central differences.
    #[test]
    fn cross_entropy_backward_matches_finite_differences() -> Result<(), ExecError> {
        let (n, c) = (4, 5);
        let logits: Vec<f32> = Rng(2).vec(n * c).iter().map(|v| v * 3.0).collect();
        let targets = [4, 0, 2, 2];
        let dloss = 1.7;
        let mut g = vec![f32::NAN; n * c];
        cross_entropy_backward(&logits, c, &targets, dloss, &mut g)?;
        // An out-of-range target (none here: the backward above succeeded) gives NaN and fails.
        let fd = central_diff(&logits, 1e-2, |x| {
            let mut o = [0.0];
            cross_entropy(x, c, &targets, &mut o)
                .map_or(f64::NAN, |()| f64::from(o[0]) * f64::from(dloss))
        });
        assert!(rel_err(&g, &fd) < 1e-2);
        Ok(())
    }

    #[test]
    fn out_of_range_targets_err() {
        let mut out = [0.0; 8];
        let err = ExecError::IdOutOfRange { value: 3, limit: 3 };
        assert_eq!(
            cross_entropy(&[0.0; 6], 3, &[0, 3], &mut out[..1]),
            Err(err)
        );
        assert_eq!(
            cross_entropy_backward(&[0.0; 6], 3, &[-1, 0], 1.0, &mut out[..6]),
            Err(ExecError::IdOutOfRange {
                value: -1,
                limit: 3
            })
        );
    }

    #[test]
    fn mse_forward_and_backward() {
        let mut rng = Rng(3);
        let (a, b) = (rng.vec(10), rng.vec(10));
        let mut out = [0.0];
        mse(&a, &b, &mut out);
        let want: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
            .sum::<f64>()
            / 10.0;
        assert!((f64::from(out[0]) - want).abs() < 1e-6);
        let mut da = vec![0.0; 10];
        mse_backward(&a, &b, 0.5, &mut da);
        for i in 0..10 {
            assert!((da[i] - (a[i] - b[i]) * 2.0 * 0.5 / 10.0).abs() < 1e-7);
        }
    }
}
