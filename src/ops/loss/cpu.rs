//! CPU reference kernels of the loss ops (mean cross-entropy and its count of kept rows, mean
//! squared error, the fused linear cross-entropy, and their backwards).

mod kernels;
mod linear;

use crate::exec::cpu::CpuStep;
use crate::exec::ExecError;
use crate::ir::{CeParams, DType, LceGrad, LinearCe, Op, TensorType};
use crate::ops::cpu::{foreign_op, packed_pair_mut, CpuKernel};
use kernels::Targets;
use linear::{Grads, Head};

/// Rows of fp32 logits the CPU kernels take at a time for `lce` over operands of `operand`:
/// as many as fit in the bytes of `lce.chunk` rows of logits in that type (a CUDA chunk's).
fn fp32_chunk(lce: &LinearCe, operand: DType) -> usize {
    (lce.chunk.saturating_mul(operand.size() as usize) / 4).max(1)
}

/// The linear cross-entropy head of `step` (inputs x, w, targets first).
fn head<'a>(step: &CpuStep<'a>, lce: &LinearCe) -> Head<'a> {
    let (x, w) = (step.shape(0), step.shape(1));
    Head {
        x: step.input(0),
        w: step.input(1),
        targets: step.ids(2),
        dim: x.last().copied().unwrap_or(1),
        classes: if lce.transposed { w[0] } else { w[1] },
        transposed: lce.transposed,
        chunk: fp32_chunk(lce, step.dtype(0)),
        operand: step.dtype(0),
        ce: lce.ce,
    }
}

/// The targets of cross-entropy `step` (input 1) and its mean's divisor: the rows, or with
/// an ignored id the count of kept rows, its last input.
fn targets<'a>(step: &CpuStep<'a>, ce: CeParams, backward: bool) -> Targets<'a> {
    let ids = step.ids(1);
    let divisor = match ce.ignore_index {
        Some(_) => step.input(ce.inputs(backward) - 1)[0],
        None => ids.len() as f32,
    };
    Targets { ids, ce, divisor }
}

impl CpuKernel for super::Family {
    fn run_cpu(&self, step: &CpuStep) -> Result<(), ExecError> {
        let x = |i| step.input(i);
        let classes = || step.shape(0).last().copied().unwrap_or(1);
        match step.op() {
            Op::CrossEntropy(ce) => {
                kernels::cross_entropy(x(0), classes(), &targets(step, *ce, false), step.output())
            }
            Op::CrossEntropyBackward(ce) => kernels::cross_entropy_backward(
                x(0),
                classes(),
                &targets(step, *ce, true),
                x(2)[0],
                step.output(),
            ),
            Op::KeptCount(ce) => {
                kernels::kept_count(step.ids(0), *ce, step.output());
                Ok(())
            }
            Op::LinearCrossEntropy(lce) => {
                linear::forward(&head(step, lce), step.output(), step.workspace())
            }
            Op::LinearCrossEntropyBackward { lce, which } => {
                let (h, rows, ws) = (head(step, lce), (x(3), x(4)), step.workspace());
                let out = step.output();
                let grads = match which {
                    LceGrad::Input => Grads {
                        dx: Some(out),
                        dw: None,
                    },
                    LceGrad::Weight => Grads {
                        dx: None,
                        dw: Some(out),
                    },
                    LceGrad::Both => {
                        let lens = (h.x.len(), h.w.len());
                        let (dx, dw) = packed_pair_mut(out, lens, step.dtype(0).size());
                        Grads {
                            dx: Some(dx),
                            dw: Some(dw),
                        }
                    }
                };
                linear::backward(&h, rows, grads, ws)
            }
            Op::Mse => {
                kernels::mse(x(0), x(1), step.output());
                Ok(())
            }
            Op::MseBackward => {
                kernels::mse_backward(x(0), x(1), x(2)[0], step.output());
                Ok(())
            }
            op => Err(foreign_op(op, "loss")),
        }
    }

    /// One chunk of fp32 logits for the linear cross-entropy ops (as many bytes as a chunk of
    /// logits in the operands' type, at least a row); nothing for the others.
    fn cpu_workspace_bytes(&self, op: &Op, inputs: &[&TensorType], _: &TensorType) -> u64 {
        match op {
            Op::LinearCrossEntropy(lce) | Op::LinearCrossEntropyBackward { lce, .. } => {
                match (super::rules::linear_ce(lce, inputs), inputs.first()) {
                    (Ok((rows, _, classes)), Some(x)) => {
                        let chunk = fp32_chunk(lce, x.dtype);
                        4 * Head::workspace_len(rows as usize, classes as usize, chunk) as u64
                    }
                    _ => 0,
                }
            }
            _ => 0,
        }
    }
}
