//! Loss kernels: mean cross-entropy against range-checked integer targets (rows of an
//! ignored id take no part), the count of kept rows, mean squared error, and their backwards.

use rayon::prelude::*;

use crate::exec::kernels::check_ids;
use crate::exec::kernels::softmax::{logsumexp, softmax};
use crate::exec::ExecError;
use crate::ir::CeParams;

/// Rows per parallel task of the cross-entropy forward.
const ROWS_PER_TASK: usize = 64;

/// A cross-entropy's targets and the divisor of its mean.
pub struct Targets<'a> {
    /// One id per row: a class in `0..classes`, or the ignored id of `ce`.
    pub ids: &'a [i32],
    /// Which rows take part.
    pub ce: CeParams,
    /// The mean's divisor: the number of rows, or with an ignored id their `kept_count`.
    pub divisor: f32,
}

impl Targets<'_> {
    /// Checks that every kept target names one of `classes`.
    fn check(&self, classes: usize) -> Result<(), ExecError> {
        check_ids(self.ids, classes, self.ce.ignore_index)
    }
}

/// Writes the number of `targets` that `ce` keeps, at least 1, into the 1-element `out`.
pub fn kept_count(targets: &[i32], ce: CeParams, out: &mut [f32]) {
    let kept = targets.par_iter().filter(|&&t| ce.keeps(t)).count();
    out[0] = kept.max(1) as f32;
}

/// Writes the cross-entropy of `logits` [n, classes] against `t`, summed over the kept rows
/// and divided by `t.divisor`, into the 1-element `out` (0 when n = 0). Errs on a kept target
/// out of range.
pub fn cross_entropy(
    logits: &[f32],
    classes: usize,
    t: &Targets,
    out: &mut [f32],
) -> Result<(), ExecError> {
    t.check(classes)?;
    // Fixed-size row blocks summed in parallel, then the partials in order: deterministic.
    let partials: Vec<f64> = t
        .ids
        .par_chunks(ROWS_PER_TASK)
        .enumerate()
        .map(|(blk, ts)| {
            let rows = logits[blk * ROWS_PER_TASK * classes..].chunks(classes.max(1));
            ts.iter()
                .zip(rows)
                .filter(|(&id, _)| t.ce.keeps(id))
                .map(|(&id, row)| f64::from(logsumexp(row) - row[id as usize]))
                .sum()
        })
        .collect();
    let total: f64 = partials.iter().sum();
    out[0] = if t.ids.is_empty() {
        0.0
    } else {
        (total / f64::from(t.divisor)) as f32
    };
    Ok(())
}

/// Writes `dlogits = (softmax(logits) - onehot(target)) * dloss / t.divisor`, 0 on the rows
/// of the ignored id. Errs on a kept target out of range (dlogits is then unspecified).
pub fn cross_entropy_backward(
    logits: &[f32],
    classes: usize,
    t: &Targets,
    dloss: f32,
    dlogits: &mut [f32],
) -> Result<(), ExecError> {
    t.check(classes)?;
    if classes == 0 || t.ids.is_empty() {
        return Ok(());
    }
    softmax(logits, &[t.ids.len(), classes], 1, dlogits);
    let scale = dloss / t.divisor;
    dlogits
        .par_chunks_mut(classes)
        .zip(t.ids.par_iter())
        .for_each(|(row, &id)| {
            if t.ce.keeps(id) {
                row[id as usize] -= 1.0;
                row.iter_mut().for_each(|v| *v *= scale);
            } else {
                row.fill(0.0);
            }
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

    /// Targets `ids`, every row kept.
    fn all(ids: &[i32]) -> Targets<'_> {
        Targets {
            ids,
            ce: CeParams::default(),
            divisor: ids.len() as f32,
        }
    }

    /// Targets `ids` ignoring `k`, divided by their kept count.
    fn ignoring(ids: &[i32], k: i32) -> Targets<'_> {
        let ce = CeParams {
            ignore_index: Some(k),
        };
        let mut kept = [f32::NAN];
        kept_count(ids, ce, &mut kept);
        Targets {
            ids,
            ce,
            divisor: kept[0],
        }
    }

    /// The cross-entropy of one row in f64.
    fn naive_row(row: &[f32], t: i32) -> f64 {
        let row: Vec<f64> = row.iter().map(|&v| f64::from(v)).collect();
        let m = row.iter().copied().fold(f64::MIN, f64::max);
        m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln() - row[t as usize]
    }

    #[test]
    fn cross_entropy_matches_naive() -> Result<(), ExecError> {
        let logits: Vec<f32> = Rng(1).vec(12).iter().map(|v| v * 30.0).collect();
        let targets = [0, 3, 2];
        let mut out = [f32::NAN];
        cross_entropy(&logits, 4, &all(&targets), &mut out)?;
        let want: f64 = (0..3)
            .map(|r| naive_row(&logits[r * 4..r * 4 + 4], targets[r]))
            .sum::<f64>()
            / 3.0;
        assert!((f64::from(out[0]) - want).abs() < 1e-4, "{} {want}", out[0]);
        Ok(())
    }

    /// Rows of the ignored id add nothing and the mean is over the kept rows, whether the
    /// ignored id is -100 or a class (1).
    #[test]
    fn ignored_rows_take_no_loss() -> Result<(), ExecError> {
        let logits: Vec<f32> = Rng(4).vec(20).iter().map(|v| v * 5.0).collect();
        for (targets, k, kept) in [
            ([0, -100, 3, -100, 2], -100, vec![0, 2, 4]),
            ([1, 0, 1, 3, 2], 1, vec![1, 3, 4]),
        ] {
            let t = ignoring(&targets, k);
            assert_eq!(t.divisor, 3.0);
            let mut out = [f32::NAN];
            cross_entropy(&logits, 4, &t, &mut out)?;
            let want: f64 = kept
                .iter()
                .map(|&r| naive_row(&logits[r * 4..r * 4 + 4], targets[r]))
                .sum::<f64>()
                / 3.0;
            assert!((f64::from(out[0]) - want).abs() < 1e-5, "{} {want}", out[0]);
        }
        Ok(())
    }

    /// Tolerance: relative L2 error 1e-2 against h = 1e-2 central differences, every row kept
    /// and with ignored rows (whose gradient is exactly 0).
    #[test]
    fn cross_entropy_backward_matches_finite_differences() -> Result<(), ExecError> {
        let (n, c) = (4, 5);
        let logits: Vec<f32> = Rng(2).vec(n * c).iter().map(|v| v * 3.0).collect();
        let (kept, partial) = ([4, 0, 2, 2], [4, -100, 2, -100]);
        for t in [all(&kept), ignoring(&partial, -100)] {
            let dloss = 1.7;
            let mut g = vec![f32::NAN; n * c];
            cross_entropy_backward(&logits, c, &t, dloss, &mut g)?;
            // A target out of range (none here: the backward above succeeded) fails.
            let fd = central_diff(&logits, 1e-2, |x| {
                let mut o = [0.0];
                cross_entropy(x, c, &t, &mut o)
                    .map_or(f64::NAN, |()| f64::from(o[0]) * f64::from(dloss))
            });
            assert!(rel_err(&g, &fd) < 1e-2);
            for (r, &id) in t.ids.iter().enumerate() {
                if !t.ce.keeps(id) {
                    assert!(g[r * c..(r + 1) * c].iter().all(|&v| v == 0.0));
                }
            }
        }
        Ok(())
    }

    /// Every row ignored: the count is 1, the loss 0 and the gradient 0 (PyTorch gives NaN).
    #[test]
    fn every_row_ignored_gives_zero_loss_and_gradient() -> Result<(), ExecError> {
        let logits = Rng(5).vec(6);
        let t = ignoring(&[-100, -100], -100);
        assert_eq!(t.divisor, 1.0);
        let mut out = [f32::NAN];
        cross_entropy(&logits, 3, &t, &mut out)?;
        assert_eq!(out[0], 0.0);
        let mut g = [f32::NAN; 6];
        cross_entropy_backward(&logits, 3, &t, 1.0, &mut g)?;
        assert_eq!(g, [0.0; 6]);
        Ok(())
    }

    /// A kept target outside the classes is an error; the ignored id is not, and -1 is out of
    /// range when -100 is the ignored id.
    #[test]
    fn out_of_range_targets_err() {
        let mut out = [0.0; 8];
        let err = |value| Err(ExecError::IdOutOfRange { value, limit: 3 });
        assert_eq!(
            cross_entropy(&[0.0; 6], 3, &all(&[0, 3]), &mut out[..1]),
            err(3)
        );
        assert_eq!(
            cross_entropy_backward(&[0.0; 6], 3, &all(&[-1, 0]), 1.0, &mut out[..6]),
            err(-1)
        );
        let t = [-100, 3];
        assert_eq!(
            cross_entropy(&[0.0; 6], 3, &ignoring(&t, -100), &mut out[..1]),
            err(3)
        );
        let t = [-100, -1];
        let ignored = ignoring(&t, -100);
        assert_eq!(
            cross_entropy_backward(&[0.0; 6], 3, &ignored, 1.0, &mut out[..6]),
            err(-1)
        );
        let t = [-100, 2];
        assert_eq!(
            cross_entropy(&[0.0; 6], 3, &ignoring(&t, -100), &mut out[..1]),
            Ok(())
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
