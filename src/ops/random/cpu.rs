//! CPU reference kernels of the random ops: dropout, whose mask comes from the counter-based
//! hash of [`crate::exec::kernels::rng`], so the backward (the same call on dy) reproduces it.

use crate::exec::cpu::CpuStep;
use crate::exec::kernels::rng::uniform01;
use crate::exec::ExecError;
use crate::ir::{Op, TensorType};
use crate::ops::cpu::{foreign_op, CpuKernel};
use rayon::prelude::*;

impl CpuKernel for super::Family {
    fn run_cpu(&self, step: &CpuStep) -> Result<(), ExecError> {
        match step.op() {
            Op::Dropout { p, seed } => {
                dropout(
                    step.input(0),
                    *p,
                    *seed,
                    step.dropout_stream(),
                    step.output(),
                );
                Ok(())
            }
            op => Err(foreign_op(op, "random")),
        }
    }

    fn cpu_workspace_bytes(&self, _: &Op, _: &[&TensorType], _: &TensorType) -> u64 {
        0
    }
}

/// Dropout: `out[i] = x[i] * (1 / (1 - p))` if `uniform01(seed, step, i) >= p`, else 0. The backward
/// is the same call on dy (same mask and scale).
pub fn dropout(x: &[f32], p: f32, seed: u64, step: u64, out: &mut [f32]) {
    debug_assert_eq!(x.len(), out.len());
    const CHUNK: usize = 4096;
    let scale = 1.0 / (1.0 - p);
    out.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .enumerate()
        .for_each(|(c, (o, x))| {
            for (t, (o, &x)) in o.iter_mut().zip(x).enumerate() {
                let keep = uniform01(seed, step, (c * CHUNK + t) as u64) >= p;
                *o = if keep { x * scale } else { 0.0 };
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropout_mask_is_reproducible() {
        let x: Vec<f32> = (0..10_000).map(|i| i as f32 + 1.0).collect();
        let (mut a, mut b) = (vec![0.0; x.len()], vec![0.0; x.len()]);
        dropout(&x, 0.25, 9, 4, &mut a);
        dropout(&x, 0.25, 9, 4, &mut b);
        assert_eq!(a, b);
        let kept = a.iter().filter(|&&v| v != 0.0).count() as f64 / x.len() as f64;
        assert!((kept - 0.75).abs() < 0.02);
        for (i, (&o, &v)) in a.iter().zip(&x).enumerate() {
            let keep = uniform01(9, 4, i as u64) >= 0.25;
            assert_eq!(o, if keep { v * (1.0 / 0.75) } else { 0.0 });
        }
        dropout(&x, 0.0, 9, 4, &mut a);
        assert_eq!(a, x);
    }
}
