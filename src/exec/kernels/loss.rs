//! Loss kernels (mean cross-entropy, mean squared error) and embedding lookup with its
//! deterministic scatter-add backward. Integer inputs are range-checked.

use rayon::prelude::*;

use super::reduce::{logsumexp, softmax};

/// An integer input (class target or embedding id) outside `0..limit`.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexOutOfRange {
    /// The offending value.
    pub value: i64,
    /// The exclusive upper bound it had to stay below.
    pub limit: usize,
}

/// Rows per parallel task of the cross-entropy forward.
const ROWS_PER_TASK: usize = 64;

/// Checks that every id lies in `0..limit`, or reports the first that does not.
fn check(ids: &[i32], limit: usize) -> Result<(), IndexOutOfRange> {
    match ids
        .iter()
        .find(|&&v| usize::try_from(v).map_or(true, |u| u >= limit))
    {
        Some(&v) => Err(IndexOutOfRange {
            value: i64::from(v),
            limit,
        }),
        None => Ok(()),
    }
}

/// Writes the mean cross-entropy of `logits` [n, classes] against integer `targets` [n] in
/// `0..classes` into the 1-element `out` (0 when n = 0). Errs on a target out of range.
pub fn cross_entropy(
    logits: &[f32],
    classes: usize,
    targets: &[i32],
    out: &mut [f32],
) -> Result<(), IndexOutOfRange> {
    check(targets, classes)?;
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
) -> Result<(), IndexOutOfRange> {
    check(targets, classes)?;
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

/// Gathers rows of `table` [rows, dim] by `ids` (any shape) into `out` [ids.len(), dim].
/// Errs on an id outside `0..rows`; nothing happens when `dim` is 0.
pub fn embedding(
    table: &[f32],
    dim: usize,
    ids: &[i32],
    out: &mut [f32],
) -> Result<(), IndexOutOfRange> {
    if dim == 0 {
        return Ok(());
    }
    check(ids, table.len() / dim)?;
    out.par_chunks_mut(dim)
        .zip(ids.par_iter())
        .for_each(|(row, &id)| {
            let id = id as usize;
            row.copy_from_slice(&table[id * dim..(id + 1) * dim]);
        });
    Ok(())
}

/// Overwrites `dtable` [rows, dim] with the scatter-add of `dy` rows by id, summing repeated
/// ids in id-list order (deterministic). Errs on an id outside `0..rows`.
pub fn embedding_backward(
    ids: &[i32],
    dy: &[f32],
    dim: usize,
    dtable: &mut [f32],
) -> Result<(), IndexOutOfRange> {
    dtable.fill(0.0);
    if dim == 0 {
        return Ok(());
    }
    check(ids, dtable.len() / dim)?;
    for (&id, g) in ids.iter().zip(dy.chunks(dim)) {
        let id = id as usize;
        dtable[id * dim..(id + 1) * dim]
            .iter_mut()
            .zip(g)
            .for_each(|(d, g)| *d += g);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testing::{central_diff, rel_err, Rng};
    use super::*;

    #[test]
    fn cross_entropy_matches_naive() -> Result<(), IndexOutOfRange> {
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
    fn cross_entropy_backward_matches_finite_differences() -> Result<(), IndexOutOfRange> {
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
    fn out_of_range_targets_and_ids_err() {
        let mut out = [0.0; 8];
        let err = IndexOutOfRange { value: 3, limit: 3 };
        assert_eq!(
            cross_entropy(&[0.0; 6], 3, &[0, 3], &mut out[..1]),
            Err(err.clone())
        );
        assert_eq!(
            cross_entropy_backward(&[0.0; 6], 3, &[-1, 0], 1.0, &mut out[..6]),
            Err(IndexOutOfRange {
                value: -1,
                limit: 3
            })
        );
        assert_eq!(
            embedding(&[0.0; 6], 2, &[3], &mut out[..2]),
            Err(err.clone())
        );
        assert_eq!(
            embedding_backward(&[0, 3], &[0.0; 4], 2, &mut out[..6]),
            Err(err)
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

    #[test]
    fn embedding_gather_and_scatter_add() -> Result<(), IndexOutOfRange> {
        let table: Vec<f32> = (0..12).map(|v| v as f32).collect(); // [4, 3]
        let ids = [2, 0, 2, 3];
        let mut out = vec![f32::NAN; 12];
        embedding(&table, 3, &ids, &mut out)?;
        assert_eq!(
            out,
            [6.0, 7.0, 8.0, 0.0, 1.0, 2.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0]
        );
        let dy: Vec<f32> = (0..12).map(|v| v as f32 * 0.5).collect();
        let mut dt = vec![f32::NAN; 12];
        embedding_backward(&ids, &dy, 3, &mut dt)?;
        assert_eq!(
            dt,
            [1.5, 2.0, 2.5, 0.0, 0.0, 0.0, 3.0, 4.0, 5.0, 4.5, 5.0, 5.5]
        );
        Ok(())
    }
}
