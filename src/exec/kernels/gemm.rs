//! The GEMM every dense CPU kernel (matmul, convolution) runs on: strided matrix views and a
//! `matrixmultiply` call whose summation order depends only on the shapes, so results are
//! bitwise identical from run to run.

/// A read-only strided matrix view: element (i, j) is `data[i * rs + j * cs]`.
#[derive(Clone, Copy)]
pub(crate) struct MatRef<'a> {
    pub(crate) data: &'a [f32],
    pub(crate) rs: usize,
    pub(crate) cs: usize,
}

/// A writable strided matrix view: element (i, j) is `data[i * rs + j * cs]`.
pub(crate) struct MatMut<'a> {
    pub(crate) data: &'a mut [f32],
    pub(crate) rs: usize,
    pub(crate) cs: usize,
}

/// Row-major view of a contiguous matrix with `cols` columns.
pub(crate) fn rm(data: &[f32], cols: usize) -> MatRef<'_> {
    MatRef {
        data,
        rs: cols,
        cs: 1,
    }
}

/// Row-major view of the transpose of a contiguous matrix with `cols` columns.
pub(crate) fn rm_t(data: &[f32], cols: usize) -> MatRef<'_> {
    MatRef {
        data,
        rs: 1,
        cs: cols,
    }
}

/// Row-major writable view of a contiguous matrix with `cols` columns.
pub(crate) fn rm_mut(data: &mut [f32], cols: usize) -> MatMut<'_> {
    MatMut {
        data,
        rs: cols,
        cs: 1,
    }
}

/// Number of elements a `rows x cols` view with strides `(rs, cs)` spans.
fn span(rows: usize, cols: usize, rs: usize, cs: usize) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        (rows - 1) * rs + (cols - 1) * cs + 1
    }
}

/// Computes `C = A B + beta C` for `A: m x k`, `B: k x n`, `C: m x n` with `matrixmultiply`.
/// With `beta == 0` the old contents of `C` are never read.
pub(crate) fn gemm(m: usize, k: usize, n: usize, a: MatRef, b: MatRef, beta: f32, c: MatMut) {
    // Soundness guard for the raw-pointer call below (cheap: O(1) per call).
    assert!(
        a.data.len() >= span(m, k, a.rs, a.cs)
            && b.data.len() >= span(k, n, b.rs, b.cs)
            && c.data.len() >= span(m, n, c.rs, c.cs),
        "gemm operand too short"
    );
    if m == 0 || n == 0 {
        return;
    }
    let st = |s: usize| s as isize;
    // SAFETY: the assert above guarantees every index the m x k, k x n and m x n views touch
    // lies inside the respective slice; C is exclusively borrowed and its strides (cs = 1 or
    // rs = 1 with the other >= the extent) never alias two elements.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.data.as_ptr(),
            st(a.rs),
            st(a.cs),
            b.data.as_ptr(),
            st(b.rs),
            st(b.cs),
            beta,
            c.data.as_mut_ptr(),
            st(c.rs),
            st(c.cs),
        );
    }
}
