//! The fused linear cross-entropy on the CPU: the logits of `chunk` rows at a time are one
//! GEMM into the workspace (`chunk x V` fp32), rounded to the operands' type as a matmul in
//! that type rounds its output, then consumed there (log-sum-exp, or turned into their
//! gradient in place and multiplied back), so no kernel holds more than one chunk of logits.
//! A row's target logit is always [`Head::target_logit`], never the GEMM's element, so the
//! backward gets the forward's log-sum-exp back from the row's loss exactly, whatever the
//! chunks. A row of the ignored id has loss 0 and gradient 0.

use rayon::prelude::*;

use crate::exec::kernels::check_ids;
use crate::exec::kernels::gemm::{gemm, rm, rm_mut, rm_t, MatRef};
use crate::exec::kernels::softmax::logsumexp;
use crate::exec::ExecError;

/// The operands of a linear cross-entropy head: hidden states `x` [rows, dim], the weight
/// `w` ([dim, classes], or [classes, dim] when `transposed`), targets in `0..classes` or the
/// id `ce` ignores, and the rows per chunk. The logits and their gradient are rounded to
/// `operand`, the type of `x` and `w` (as a low-precision GEMM writes and takes them, on
/// CUDA and under PyTorch's autocast alike).
pub struct Head<'a> {
    pub x: &'a [f32],
    pub w: &'a [f32],
    pub targets: &'a [i32],
    pub dim: usize,
    pub classes: usize,
    pub transposed: bool,
    pub chunk: usize,
    pub operand: crate::ir::DType,
    pub ce: crate::ir::CeParams,
}

impl Head<'_> {
    /// Elements of workspace the kernels need: one chunk of fp32 logits.
    pub fn workspace_len(rows: usize, classes: usize, chunk: usize) -> usize {
        chunk.clamp(1, rows.max(1)) * classes
    }

    /// The weight as the `[dim, classes]` matrix the logits multiply by.
    fn weight(&self) -> MatRef<'_> {
        if self.transposed {
            rm_t(self.w, self.dim)
        } else {
            rm(self.w, self.classes)
        }
    }

    /// The weight's transpose `[classes, dim]`, the input gradient's right operand.
    fn weight_t(&self) -> MatRef<'_> {
        if self.transposed {
            rm(self.w, self.dim)
        } else {
            rm_t(self.w, self.classes)
        }
    }

    /// Row ranges `(first, count)` of the chunks, in order, after checking the targets.
    fn chunks(&self) -> Result<impl Iterator<Item = (usize, usize)>, ExecError> {
        check_ids(self.targets, self.classes, self.ce.ignore_index)?;
        let (n, c) = (self.targets.len(), self.chunk.max(1));
        Ok((0..n).step_by(c).map(move |r| (r, c.min(n - r))))
    }

    /// Writes the logits of rows `r0..r0 + m` into `z` (`m x classes`), rounded to the
    /// operands' type.
    fn logits(&self, (r0, m): (usize, usize), z: &mut [f32]) {
        let x = rm(&self.x[r0 * self.dim..], self.dim);
        gemm(
            m,
            self.dim,
            self.classes,
            x,
            self.weight(),
            0.0,
            rm_mut(z, self.classes),
        );
        if self.operand != crate::ir::DType::F32 {
            z[..m * self.classes]
                .par_iter_mut()
                .for_each(|v| *v = crate::exec::lowp::round(self.operand, *v));
        }
    }

    /// Row `r`'s logit of class `t` (in range), the same value in the forward and in every
    /// backward: the fp32 dot product of the row with the weight's column in the CUDA
    /// kernel's order (32 lanes each fusing the multiply-adds of every 32nd term in order,
    /// then summed pairwise, lane `l` taking lane `l + o` for `o` = 16, 8, 4, 2, 1), rounded
    /// to the operands' type.
    fn target_logit(&self, r: usize, t: usize) -> f32 {
        let x = &self.x[r * self.dim..(r + 1) * self.dim];
        let w = |k: usize| match self.transposed {
            true => self.w[t * self.dim + k],
            false => self.w[k * self.classes + t],
        };
        let mut lanes = [0.0f32; 32];
        for (k, &xk) in x.iter().enumerate() {
            lanes[k % 32] = xk.mul_add(w(k), lanes[k % 32]);
        }
        for o in [16, 8, 4, 2, 1] {
            for l in 0..o {
                lanes[l] += lanes[l + o];
            }
        }
        crate::exec::lowp::round(self.operand, lanes[0])
    }

    /// Turns the logits `z` of rows `r0..r0 + m` into their gradient in place:
    /// `(exp(z - lse) - onehot(target)) * drows`, with `lse = rows + target_logit` (the
    /// forward's row loss gives the log-sum-exp back, so no second pass over the row is
    /// needed); 0 on the rows of the ignored id.
    fn logits_grad(&self, (r0, m): (usize, usize), rows: &[f32], drows: &[f32], z: &mut [f32]) {
        z[..m * self.classes]
            .par_chunks_mut(self.classes)
            .enumerate()
            .for_each(|(i, row)| {
                let r = r0 + i;
                if !self.ce.keeps(self.targets[r]) {
                    row.fill(0.0);
                    return;
                }
                let t = self.targets[r] as usize;
                let lse = rows[r] + self.target_logit(r, t);
                row.iter_mut().for_each(|v| *v = (*v - lse).exp());
                row[t] -= 1.0;
                row.iter_mut()
                    .for_each(|v| *v = crate::exec::lowp::round(self.operand, *v * drows[r]));
            });
    }
}

/// Writes each row's cross-entropy `logsumexp(z) - z[target]` of the logits `z = x @ w` into
/// `out` [rows], 0 for a row of the ignored id. `ws` holds at least [`Head::workspace_len`]
/// elements. Errs on a kept target out of range.
pub fn forward(h: &Head, out: &mut [f32], ws: &mut [f32]) -> Result<(), ExecError> {
    for (r0, m) in h.chunks()? {
        h.logits((r0, m), ws);
        out[r0..r0 + m]
            .par_iter_mut()
            .zip(ws[..m * h.classes].par_chunks(h.classes))
            .enumerate()
            .for_each(|(i, (o, row))| {
                let t = h.targets[r0 + i];
                *o = if h.ce.keeps(t) {
                    logsumexp(row) - h.target_logit(r0 + i, t as usize)
                } else {
                    0.0
                }
            });
    }
    Ok(())
}

/// The gradients a backward pass writes: `dx = dz @ w^T` [rows, dim] and `dw = x^T @ dz`
/// ([dim, classes], or its transpose when `transposed`), either or both.
pub struct Grads<'a> {
    pub dx: Option<&'a mut [f32]>,
    pub dw: Option<&'a mut [f32]>,
}

/// Writes the gradients `g` asks for, for the per-row losses `rows` and their gradient
/// `drows`, chunk by chunk: each chunk's logits and their gradient are computed once for
/// both; `dw` is summed over the chunks in order. Each gradient has the same bits whether
/// it is written alone or beside the other. Errs on a kept target out of range (the
/// gradients are then unspecified).
pub fn backward(
    h: &Head,
    (rows, drows): (&[f32], &[f32]),
    mut g: Grads,
    ws: &mut [f32],
) -> Result<(), ExecError> {
    let (d, v) = (h.dim, h.classes);
    let mut beta = 0.0;
    for (r0, m) in h.chunks()? {
        h.logits((r0, m), ws);
        h.logits_grad((r0, m), rows, drows, ws);
        let dz = &ws[..m * v];
        if let Some(dx) = g.dx.as_deref_mut() {
            let out = rm_mut(&mut dx[r0 * d..(r0 + m) * d], d);
            gemm(m, v, d, rm(dz, v), h.weight_t(), 0.0, out);
        }
        if let Some(dw) = g.dw.as_deref_mut() {
            let x = &h.x[r0 * d..(r0 + m) * d];
            if h.transposed {
                gemm(v, m, d, rm_t(dz, v), rm(x, d), beta, rm_mut(dw, d));
            } else {
                gemm(d, m, v, rm_t(x, d), rm(dz, v), beta, rm_mut(dw, v));
            }
        }
        beta = 1.0;
    }
    if beta == 0.0 {
        g.dw.into_iter().for_each(|dw| dw.fill(0.0));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::kernels::testing::{assert_close, central_diff, Rng};
    use crate::ir::CeParams;

    /// Ignores the id -100.
    const IGNORE: CeParams = CeParams {
        ignore_index: Some(-100),
    };

    /// A head of 5 rows, dim 3, 7 classes over seeded data.
    fn data(transposed: bool) -> (Vec<f32>, Vec<f32>, Vec<i32>) {
        let mut rng = Rng(11 + u64::from(transposed));
        let x = rng.vec(15).iter().map(|v| v * 2.0).collect();
        let w = rng.vec(21).iter().map(|v| v * 2.0).collect();
        (x, w, vec![6, 0, 3, 3, 1])
    }

    fn head<'a>(
        x: &'a [f32],
        w: &'a [f32],
        t: &'a [i32],
        transposed: bool,
        chunk: usize,
    ) -> Head<'a> {
        head_ce(x, w, t, transposed, chunk, CeParams::default())
    }

    fn head_ce<'a>(
        x: &'a [f32],
        w: &'a [f32],
        t: &'a [i32],
        transposed: bool,
        chunk: usize,
        ce: CeParams,
    ) -> Head<'a> {
        Head {
            x,
            w,
            targets: t,
            dim: 3,
            classes: 7,
            transposed,
            chunk,
            operand: crate::ir::DType::F32,
            ce,
        }
    }

    /// The row losses in f64 from the logits written out naively.
    fn naive_rows(x: &[f32], w: &[f32], t: &[i32], transposed: bool) -> Vec<f64> {
        (0..t.len())
            .map(|r| {
                let z: Vec<f64> = (0..7)
                    .map(|c| {
                        (0..3)
                            .map(|k| {
                                let wkc = if transposed {
                                    w[c * 3 + k]
                                } else {
                                    w[k * 7 + c]
                                };
                                f64::from(x[r * 3 + k]) * f64::from(wkc)
                            })
                            .sum()
                    })
                    .collect();
                if t[r] == -100 {
                    return 0.0;
                }
                let m = z.iter().copied().fold(f64::MIN, f64::max);
                m + z.iter().map(|v| (v - m).exp()).sum::<f64>().ln() - z[t[r] as usize]
            })
            .collect()
    }

    fn rows_of(h: &Head) -> Vec<f32> {
        let mut out = vec![f32::NAN; h.targets.len()];
        let mut ws = vec![f32::NAN; Head::workspace_len(5, 7, h.chunk)];
        forward(h, &mut out, &mut ws).map_or_else(|_| vec![f32::NAN; 5], |()| out)
    }

    #[test]
    fn forward_matches_naive_rows_for_every_chunk_and_layout() {
        for transposed in [false, true] {
            let (x, w, t) = data(transposed);
            let want = naive_rows(&x, &w, &t, transposed);
            for chunk in [1, 2, 5, 9] {
                let got = rows_of(&head(&x, &w, &t, transposed, chunk));
                assert_close(&got, &want, 1e-6, &format!("chunk {chunk}"));
            }
            // Rows 1 and 3 ignored: their losses 0, the others unchanged.
            let ignored = [t[0], -100, t[2], -100, t[4]];
            let want = naive_rows(&x, &w, &ignored, transposed);
            assert_eq!((want[1], want[3]), (0.0, 0.0));
            let got = rows_of(&head_ce(&x, &w, &ignored, transposed, 2, IGNORE));
            assert_close(&got, &want, 1e-6, "ignored rows");
        }
    }

    /// Tolerance: relative L2 error 1e-2 against h = 1e-2 central differences of
    /// `sum(rows * drows)`, for chunks that divide the rows and one that does not, every row
    /// kept and rows 0 and 3 ignored (an ignored row's hidden-state gradient exactly 0).
    #[test]
    fn both_gradients_match_finite_differences() -> Result<(), ExecError> {
        let drows = [0.3, -1.1, 0.7, 2.0, 0.5];
        let objective = |rows: &[f32]| -> f64 {
            rows.iter()
                .zip(&drows)
                .map(|(&r, &g)| f64::from(r) * f64::from(g))
                .sum()
        };
        let cases = [(false, 2), (true, 3), (true, 5)].into_iter();
        for ((transposed, chunk), ce) in cases.flat_map(|c| [(c, CeParams::default()), (c, IGNORE)])
        {
            let (x, w, mut t) = data(transposed);
            if ce == IGNORE {
                t[0] = -100;
                t[3] = -100;
            }
            let h = head_ce(&x, &w, &t, transposed, chunk, ce);
            let rows = rows_of(&h);
            let mut ws = vec![f32::NAN; Head::workspace_len(5, 7, chunk)];
            let mut dx = vec![f32::NAN; 15];
            let dx_only = Grads {
                dx: Some(&mut dx),
                dw: None,
            };
            backward(&h, (&rows, &drows), dx_only, &mut ws)?;
            let mut dw = vec![f32::NAN; 21];
            let dw_only = Grads {
                dx: None,
                dw: Some(&mut dw),
            };
            backward(&h, (&rows, &drows), dw_only, &mut ws)?;
            // Both in one pass: the same bits.
            let (mut dx2, mut dw2) = (vec![f32::NAN; 15], vec![f32::NAN; 21]);
            let both = Grads {
                dx: Some(&mut dx2),
                dw: Some(&mut dw2),
            };
            backward(&h, (&rows, &drows), both, &mut ws)?;
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!((bits(&dx2), bits(&dw2)), (bits(&dx), bits(&dw)));
            let loss = |x: &[f32], w: &[f32]| {
                objective(&rows_of(&head_ce(x, w, &t, transposed, chunk, ce)))
            };
            let fd_x = central_diff(&x, 1e-2, |x| loss(x, &w));
            let fd_w = central_diff(&w, 1e-2, |w| loss(&x, w));
            assert_close(&dx, &fd_x, 1e-2, "dx");
            assert_close(&dw, &fd_w, 1e-2, "dw");
            if ce == IGNORE {
                assert!(dx[..3].iter().chain(&dx[9..12]).all(|&v| v == 0.0));
            }
        }
        Ok(())
    }

    /// With bf16 operands the logits are rounded to bf16 before the log-sum-exp, the target
    /// logit too, and a row's loss plus its target logit gives the log-sum-exp of its rounded
    /// logits back, as the backward takes it.
    #[test]
    fn bf16_logits_are_rounded_and_give_the_log_sum_exp_back() {
        use crate::exec::lowp::round;
        use crate::ir::DType::BF16;
        let (x, w, t) = data(false);
        let [x, w] = [x, w].map(|v| v.iter().map(|&e| round(BF16, e)).collect::<Vec<_>>());
        let h = Head {
            operand: BF16,
            ..head(&x, &w, &t, false, 2)
        };
        let rows = rows_of(&h);
        let mut z = vec![0.0; 35];
        h.logits((0, 5), &mut z);
        for (r, (&loss, zr)) in rows.iter().zip(z.chunks(7)).enumerate() {
            let naive: Vec<f32> = (0..7)
                .map(|c| round(BF16, (0..3).map(|k| x[r * 3 + k] * w[k * 7 + c]).sum()))
                .collect();
            assert_eq!(zr, naive, "row {r}'s logits");
            let lse = logsumexp(zr);
            let target = h.target_logit(r, t[r] as usize);
            assert_eq!(target, naive[t[r] as usize], "row {r}'s target logit");
            assert_close(&[loss], &[f64::from(lse - target)], 1e-6, "loss");
            assert_close(&[loss + target], &[f64::from(lse)], 1e-6, "log-sum-exp");
        }
    }

    #[test]
    fn out_of_range_targets_err() {
        let (x, w, _) = data(false);
        let t = [0, 7, 1, 1, 1];
        let h = head(&x, &w, &t, false, 2);
        let mut ws = vec![0.0; 14];
        let err = Err(ExecError::IdOutOfRange { value: 7, limit: 7 });
        assert_eq!(forward(&h, &mut [0.0; 5], &mut ws), err);
        let rows = [0.0; 5];
        let mut dw = [0.0; 21];
        let dw_only = Grads {
            dx: None,
            dw: Some(&mut dw),
        };
        assert_eq!(backward(&h, (&rows, &rows), dw_only, &mut ws), err);
        let t = [0, -100, 1, 1, 1];
        let ignoring = head_ce(&x, &w, &t, false, 2, IGNORE);
        assert_eq!(forward(&ignoring, &mut [0.0; 5], &mut ws), Ok(()));
        let t = [0, -100, -1, 1, 1];
        let ignoring = head_ce(&x, &w, &t, false, 2, IGNORE);
        let err = Err(ExecError::IdOutOfRange {
            value: -1,
            limit: 7,
        });
        assert_eq!(forward(&ignoring, &mut [0.0; 5], &mut ws), err);
    }
}
