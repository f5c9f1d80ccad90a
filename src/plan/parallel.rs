//! The parallel part of a plan's report (`report.parallel`): the ranks (data-parallel
//! replicas of tensor-parallel ranks), their roles and each rank's exact bytes, and the
//! NCCL reserve stated beside a GPU plan's arena.

use super::{grouped, human_bytes, BufferId, Plan};
use crate::ir::Op;
use crate::parallel::Parallel;
use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// Exact bytes of one rank's step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankBytes {
    /// Parameters this rank stores (its shards under ZeRO-3; under ZeRO-1 and 2 with mixed
    /// precision the whole 16-bit copies, whose fp32 master shards count as optimizer).
    pub params: u64,
    /// The ranks' mean gradients it holds: whole under ZeRO-0 and 1, its shards under
    /// ZeRO-2 and 3 (16-bit for a parameter kept as a 16-bit copy with fp32 masters).
    pub grads: u64,
    /// Optimizer state it stores (its shards under ZeRO-1, 2 and 3).
    pub optimizer: u64,
    /// Forward values it keeps for backward.
    pub activations: u64,
    /// The most bytes live at once of what collectives write: reduced gradients, their
    /// shards, gathered parameters (the parts above may also count them).
    pub comm: u64,
    /// Max over steps of live bytes.
    pub peak: u64,
    /// The rank's arena.
    pub arena: u64,
}

/// One rank: its index, the role whose plan it runs, its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankEntry {
    /// The rank's index, 0-based.
    pub rank: u32,
    /// The role whose plan it runs ([`role`]).
    pub role: String,
    /// Its exact bytes.
    pub bytes: RankBytes,
}

/// How the step is spread over ranks, and what each rank needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParallelReport {
    /// Data-parallel ranks.
    pub data: u32,
    /// ZeRO stage.
    pub zero: u8,
    /// Tensor-parallel ranks per replica (Megatron's split; 1: none).
    #[serde(
        default = "crate::parallel::one",
        skip_serializing_if = "crate::parallel::is_one"
    )]
    pub tensor: u32,
    /// Whether the model's batch was the whole step's, split over the ranks (else each
    /// rank runs the model's batch: `data` times it in all).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub global_batch: bool,
    /// Distinct rank roles, each with its own plan: one, as every rank runs this plan on its
    /// share of the batch and, under tensor parallelism, its slice of each split weight.
    pub roles: u32,
    /// Trained parameters whose elements the ranks do not divide (ZeRO 1-3): shards are
    /// `ceil(numel / ranks)` elements, so theirs end in zeros on the last rank(s), and every
    /// rank keeps the same plan.
    pub uneven_tensors: u64,
    /// The zero elements that pads, over all ranks, in each sharded tensor kind (state,
    /// gradient, under ZeRO-3 parameter).
    pub padding_elements: u64,
    /// Per-rank device bytes of NCCL on a GPU ([`crate::cost::NCCL_RESERVE`]); absent for
    /// the CPU, whose in-process collective needs none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl_reserve: Option<u64>,
    /// Every rank's bytes, in rank order.
    pub per_rank: Vec<RankEntry>,
}

/// The role name of every rank of a parallel plan.
pub fn role(p: Parallel) -> String {
    let data = match p.zero {
        0 => "data-parallel replica".to_string(),
        z => format!("data-parallel ZeRO-{z} shard"),
    };
    match p.tensor {
        1 => data,
        t => format!("tensor-parallel 1/{t} slice, {data}"),
    }
}

/// `plan`'s data-parallel report under `p`, with `nccl_reserve` per rank on a GPU.
pub fn report(plan: &Plan, p: Parallel, nccl_reserve: Option<u64>) -> ParallelReport {
    let written: Vec<BufferId> = plan
        .steps
        .iter()
        .filter(|s| {
            matches!(
                s.op,
                Op::AllReduce { .. }
                    | Op::ReduceScatter { .. }
                    | Op::AllGather { .. }
                    | Op::TensorReduce { .. }
            )
        })
        .filter_map(|s| s.output)
        .collect();
    let comm = plan
        .live_per_step_of(|b| written.contains(&b.id))
        .into_iter()
        .max()
        .unwrap_or(0);
    let b = &plan.report.bytes;
    let bytes = RankBytes {
        params: b.params,
        grads: b.grads,
        optimizer: b.optimizer,
        activations: b.activations,
        comm,
        peak: b.peak,
        arena: b.arena,
    };
    let (uneven_tensors, padding_elements) = uneven(plan, p);
    ParallelReport {
        data: p.data,
        zero: p.zero,
        tensor: p.tensor,
        global_batch: p.global_batch,
        roles: 1,
        uneven_tensors,
        padding_elements,
        nccl_reserve,
        per_rank: (0..p.world())
            .map(|rank| RankEntry {
                rank,
                role: role(p),
                bytes,
            })
            .collect(),
    }
}

/// Under ZeRO 1-3, the trained parameters whose elements `ranks` does not divide, and the
/// elements of zero padding their shards hold over all ranks (per sharded tensor of each:
/// its optimizer state, gradient and, under ZeRO-3, itself); nothing under ZeRO-0.
fn uneven(plan: &Plan, p: Parallel) -> (u64, u64) {
    if p.zero == 0 {
        return (0, 0);
    }
    let ranks = u64::from(p.ranks());
    plan.params
        .iter()
        .filter(|b| b.grad.is_some())
        .map(|b| {
            let numel = match &b.shard_of {
                Some(shape) => shape.iter().map(|&d| d as u64).product(),
                None => plan.buffers[b.buffer.index()].ty.numel(),
            };
            crate::ops::collective::shard_len(numel, p.ranks()) * ranks - numel
        })
        .filter(|&pad| pad > 0)
        .fold((0, 0), |(n, e), pad| (n + 1, e + pad))
}

/// The report's lines on the ranks (nothing for a plan on one device): one line per role
/// with the bytes every rank of it needs.
pub fn render(out: &mut String, plan: &Plan) {
    let Some(r) = &plan.report.parallel else {
        return;
    };
    let batch = match (r.global_batch, r.tensor) {
        (true, 1) => format!("1/{} of the model's batch", r.data),
        (false, 1) => format!("a batch of its own ({} times the model's in all)", r.data),
        (true, _) => format!("its replica's 1/{} of the model's batch", r.data),
        (false, _) => format!(
            "its replica's batch (a batch of its own for each of the {} replicas)",
            r.data
        ),
    };
    let tensor = match r.tensor {
        1 => String::new(),
        t => {
            format!(", tensor = {t} (Megatron's split: embedding, loss head and norms replicated)")
        }
    };
    let _ = writeln!(
        out,
        "  parallel: data = {}{tensor}, ZeRO-{}: {} rank(s), {} role(s); each rank runs this plan on {batch}",
        r.data,
        r.zero,
        r.per_rank.len(),
        r.roles
    );
    let Some(first) = r.per_rank.first() else {
        return;
    };
    let b = first.bytes;
    let last = r.per_rank.len().saturating_sub(1);
    let _ = writeln!(
        out,
        "  ranks 0-{last} ({}): params {}, grads {}, optimizer {}, activations {}, comm {}, peak {}, arena {} ({} bytes)",
        first.role,
        human_bytes(b.params),
        human_bytes(b.grads),
        human_bytes(b.optimizer),
        human_bytes(b.activations),
        human_bytes(b.comm),
        human_bytes(b.peak),
        human_bytes(b.arena),
        grouped(b.arena)
    );
    if r.uneven_tensors > 0 {
        let _ = writeln!(
            out,
            "  uneven shards: {} parameters do not divide by {}; their shards are padded to equal size ({} zero elements over all ranks), so every rank keeps one plan",
            r.uneven_tensors,
            r.data,
            grouped(r.padding_elements)
        );
    }
    if let (Some(n), Some(d)) = (r.nccl_reserve, plan.report.device) {
        let _ = writeln!(
            out,
            "  per GPU: arena {} + CUDA context {} + NCCL {} (stated figures) = {}",
            human_bytes(d.arena),
            human_bytes(d.context_reserve),
            human_bytes(n),
            human_bytes(d.total)
        );
    }
}
