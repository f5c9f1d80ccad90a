//! Helpers shared by the kernel unit tests: a seeded RNG, a relative error and central differences.

/// Tiny deterministic xorshift RNG yielding values in `[-1, 1)`.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    /// The next value in `[-1, 1)`.
    pub(crate) fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// `n` values in `[-1, 1)`.
    pub(crate) fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

/// Relative L2 error `|got - want| / |want|` in f64 (the denominator floored at 1e-30).
pub(crate) fn rel_err<W: Copy + Into<f64>>(got: &[f32], want: &[W]) -> f64 {
    assert_eq!(got.len(), want.len());
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (f64::from(g) - w.into()).powi(2))
        .sum();
    let den: f64 = want.iter().map(|&w| w.into().powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// `sum(a * b)` accumulated in f64: the scalar loss whose gradient a backward kernel gives
/// for cotangent `b`.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum()
}

/// Central differences `(loss(x + h e_i) - loss(x - h e_i)) / 2h` of a scalar `loss` for
/// every element `i` of `x` (the perturbed inputs are formed in f32).
pub(crate) fn central_diff(x: &[f32], h: f32, loss: impl Fn(&[f32]) -> f64) -> Vec<f64> {
    let mut p = x.to_vec();
    (0..x.len())
        .map(|i| {
            p[i] = x[i] + h;
            let up = loss(&p);
            p[i] = x[i] - h;
            let down = loss(&p);
            p[i] = x[i];
            (up - down) / (2.0 * f64::from(h))
        })
        .collect()
}

/// Multi-index of row-major flat index `flat` in `shape`.
pub(crate) fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = flat % shape[d];
        flat /= shape[d];
    }
    idx
}

/// Asserts that `got` is within relative L2 error `tol` of `want`.
pub(crate) fn assert_close<W: Copy + Into<f64>>(got: &[f32], want: &[W], tol: f64, what: &str) {
    let e = rel_err(got, want);
    assert!(e < tol, "{what}: relative error {e}");
}
