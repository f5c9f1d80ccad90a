//! CPU kernels of the collectives: each exchanges the step's values with the other ranks'
//! executors through their in-process group (`crate::exec::group`), which sums in rank
//! order, so all ranks compute the same bits. The tensor-parallel sum meets the ranks of the
//! executor's tensor group instead, and a pipeline stage's sends and receives its
//! replica's mailbox (`crate::exec::mailbox`). A plan for one rank runs without a group.

use super::shard_len;
use crate::exec::cpu::CpuStep;
use crate::exec::ExecError;
use crate::ir::{Op, TensorType};
use crate::ops::cpu::{foreign_op, CpuKernel};

/// `dst` filled with elements `rank * dst.len()..` of `full`, zero past its end.
fn take_slice(dst: &mut [f32], full: &[f32], rank: usize) {
    let start = (rank * dst.len()).min(full.len());
    let end = (start + dst.len()).min(full.len());
    dst[..end - start].copy_from_slice(&full[start..end]);
    dst[end - start..].fill(0.0);
}

/// `dst` filled with every rank's shard in rank order, the padding past `dst` dropped.
fn concat(dst: &mut [f32], shards: &[Vec<f32>]) {
    let mut at = 0;
    for s in shards {
        let n = s.len().min(dst.len() - at);
        dst[at..at + n].copy_from_slice(&s[..n]);
        at += n;
    }
}

/// Element `i` summed over the ranks' `values` in rank order (0 past a rank's end).
fn sum_at(values: &[Vec<f32>], i: usize) -> f32 {
    values
        .iter()
        .fold(0.0f32, |acc, v| acc + v.get(i).copied().unwrap_or(0.0))
}

/// The sum over the ranks of `values`, in rank order.
fn sum_of(values: &[Vec<f32>], dst: &mut [f32]) {
    for (i, d) in dst.iter_mut().enumerate() {
        *d = sum_at(values, i);
    }
}

/// Elements `range` of the mean over the ranks of `values`, summed in rank order.
fn mean_of(values: &[Vec<f32>], dst: &mut [f32], offset: usize) {
    let n = values.len() as f32;
    for (j, d) in dst.iter_mut().enumerate() {
        *d = sum_at(values, offset + j) / n;
    }
}

impl CpuKernel for super::Family {
    fn run_cpu(&self, step: &CpuStep) -> Result<(), ExecError> {
        match step.op() {
            Op::TensorCopy { .. } => {
                step.output().copy_from_slice(step.input(0));
                return Ok(());
            }
            Op::PipelineSend(link) => {
                step.output().fill(0.0);
                return step.pipeline_send(*link, step.input(0));
            }
            Op::PipelineRecv { link, .. } => return step.pipeline_recv(*link, step.output()),
            Op::TensorReduce { ranks } => {
                let out = step.output();
                return step
                    .tensor_exchange(*ranks as usize, step.input(0), |all| sum_of(all, out));
            }
            _ => {}
        }
        let (op, ranks) = match step.op() {
            op @ (Op::AllReduce { ranks }
            | Op::ReduceScatter { ranks }
            | Op::AllGather { ranks, .. }
            | Op::AllGatherInto { ranks }
            | Op::Shard { ranks }) => (op, *ranks as usize),
            op => return Err(foreign_op(op, "collective")),
        };
        let rank = step.rank(ranks)?;
        match op {
            Op::Shard { .. } => take_slice(step.output(), step.input(0), rank),
            Op::AllReduce { .. } => {
                let out = step.output();
                step.exchange(step.input(0), |all| mean_of(all, out, 0))?
            }
            Op::ReduceScatter { .. } => {
                let out = step.output();
                let offset = rank * shard_len(step.input(0).len() as u64, ranks as u32) as usize;
                step.exchange(step.input(0), |all| mean_of(all, out, offset))?
            }
            Op::AllGather { .. } => {
                let out = step.output();
                step.exchange(step.input(0), |all| concat(out, all))?
            }
            _ => {
                let dst = step.input_mut(0);
                step.exchange(step.input(1), |all| concat(dst, all))?
            }
        }
        Ok(())
    }

    fn cpu_workspace_bytes(&self, _: &Op, _: &[&TensorType], _: &TensorType) -> u64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_pad_and_gathers_drop_the_padding() {
        let full = [1.0, 2.0, 3.0, 4.0, 5.0];
        let mut shard = [9.0; 2];
        take_slice(&mut shard, &full, 2);
        assert_eq!(shard, [5.0, 0.0]);
        let mut back = [0.0; 5];
        concat(&mut back, &[vec![1.0, 2.0], vec![3.0, 4.0], vec![5.0, 0.0]]);
        assert_eq!(back, full);
    }

    #[test]
    fn tensor_sums_add_every_rank() {
        let mut out = [0.0; 2];
        sum_of(&[vec![1.0, 2.0], vec![3.0, 4.5]], &mut out);
        assert_eq!(out, [4.0, 6.5]);
    }

    #[test]
    fn means_sum_in_rank_order() {
        let mut out = [0.0; 2];
        mean_of(&[vec![1.0, 2.0, 3.0], vec![3.0, 4.0, 5.0]], &mut out, 1);
        assert_eq!(out, [3.0, 4.0]);
    }
}
