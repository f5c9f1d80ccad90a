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
    /// Forward values it keeps for backward: all of them (all live once the forward is
    /// done); on a pipeline stage, the most live at once, those of the micro-batches in
    /// flight under 1F1B.
    pub activations: u64,
    /// The most bytes live at once of what collectives write: reduced gradients, their
    /// shards, gathered parameters, the values and gradients a pipeline stage receives (the
    /// parts above may also count them).
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
    /// Pipeline stages per replica (1: none).
    #[serde(
        default = "crate::parallel::one",
        skip_serializing_if = "crate::parallel::is_one"
    )]
    pub pipeline: u32,
    /// Micro-batches per step, through the pipeline in 1F1B order (1: none).
    #[serde(
        default = "crate::parallel::one",
        skip_serializing_if = "crate::parallel::is_one"
    )]
    pub microbatches: u32,
    /// Whether the model's batch was the whole step's, split over the ranks (else each
    /// rank runs the model's batch: `data` times it in all).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub global_batch: bool,
    /// Distinct rank roles, each with its own plan: one without a pipeline, as every rank
    /// runs this plan on its share of the batch and, under tensor parallelism, its slice of
    /// each split weight; one a stage with one.
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

/// The exact bytes of a rank running `plan`.
fn rank_bytes(plan: &Plan) -> RankBytes {
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
                    | Op::PipelineRecv { .. }
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
    let activations = match plan.pipeline {
        None => b.activations,
        Some(_) => {
            let saved = super::origin::saved_for_backward(&plan.buffers, &plan.steps);
            let live = plan.live_per_step_of(|b| saved[b.id.index()]);
            live.into_iter().max().unwrap_or(0)
        }
    };
    RankBytes {
        params: b.params,
        grads: b.grads,
        optimizer: b.optimizer,
        activations,
        comm,
        peak: b.peak,
        arena: b.arena,
    }
}

/// `plan`'s data-parallel report under `p`, with `nccl_reserve` per rank on a GPU.
pub fn report(plan: &Plan, p: Parallel, nccl_reserve: Option<u64>) -> ParallelReport {
    let bytes = rank_bytes(plan);
    let per_rank = (0..p.world())
        .map(|rank| RankEntry {
            rank,
            role: role(p),
            bytes,
        })
        .collect();
    layout(p, uneven(plan, p), nccl_reserve, per_rank)
}

/// The report of a pipeline whose stage plans are `stages` (stage 0 first) under `p`: rank
/// `r` is stage `r / (data * tensor)` ([`Parallel::world`]), with its stage's bytes; one
/// role a stage.
pub fn pipeline_report(stages: &[Plan], p: Parallel, nccl_reserve: Option<u64>) -> ParallelReport {
    let padding = (stages.iter())
        .map(|s| uneven(s, p))
        .fold((0, 0), |(n, e), (a, b)| (n + a, e + b));
    let per_rank = (stages.iter().enumerate())
        .flat_map(|(s, plan)| {
            let role = format!("stage {} of {}, {}", s + 1, p.pipeline, role(p));
            let bytes = rank_bytes(plan);
            let per_stage = p.data * p.tensor;
            (0..per_stage).map(move |q| RankEntry {
                rank: s as u32 * per_stage + q,
                role: role.clone(),
                bytes,
            })
        })
        .collect();
    layout(p, padding, nccl_reserve, per_rank)
}

/// The report of layout `p` with these ranks; a role per distinct role name.
fn layout(
    p: Parallel,
    (uneven_tensors, padding_elements): (u64, u64),
    nccl_reserve: Option<u64>,
    per_rank: Vec<RankEntry>,
) -> ParallelReport {
    let mut roles: Vec<&str> = per_rank.iter().map(|r| r.role.as_str()).collect();
    roles.dedup();
    ParallelReport {
        data: p.data,
        zero: p.zero,
        tensor: p.tensor,
        pipeline: p.pipeline,
        microbatches: p.microbatches,
        global_batch: p.global_batch,
        roles: roles.len() as u32,
        uneven_tensors,
        padding_elements,
        nccl_reserve,
        per_rank,
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
    let mut tensor = String::new();
    if r.tensor > 1 {
        let t = r.tensor;
        tensor += &format!(
            ", tensor = {t} (Megatron's split: embedding, loss head and norms replicated)"
        );
    }
    if r.pipeline > 1 {
        let (p, m) = (r.pipeline, r.microbatches);
        tensor += &format!(", pipeline = {p} stages over {m} micro-batches (1F1B)");
    }
    let plans = match r.roles {
        1 => "this plan",
        _ => "its stage's plan",
    };
    let _ = writeln!(
        out,
        "  parallel: data = {}{tensor}, ZeRO-{}: {} rank(s), {} role(s); each rank runs {plans} on {batch}",
        r.data,
        r.zero,
        r.per_rank.len(),
        r.roles
    );
    let mut at = 0;
    while let Some(first) = r.per_rank.get(at) {
        let same = (r.per_rank[at..].iter())
            .take_while(|e| e.role == first.role && e.bytes == first.bytes)
            .count();
        let b = first.bytes;
        let _ = writeln!(
            out,
            "  ranks {at}-{} ({}): params {}, grads {}, optimizer {}, activations {}, comm {}, peak {}, arena {} ({} bytes)",
            at + same - 1,
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
        at += same;
    }
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
        // A pipeline's stages differ: the largest stage's arena sizes every GPU.
        let arena = (r.per_rank.iter())
            .map(|e| e.bytes.arena)
            .max()
            .unwrap_or(d.arena);
        let which = if r.roles > 1 {
            " (the largest stage's)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "  per GPU: arena{which} {} + CUDA context {} + NCCL {} (stated figures) = {}",
            human_bytes(arena),
            human_bytes(d.context_reserve),
            human_bytes(n),
            human_bytes(arena.saturating_add(d.context_reserve).saturating_add(n))
        );
    }
}
