//! The memory report: exact bytes per class, peaks per phase, and its text rendering.

use super::Plan;
use crate::ir::Phase;
use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// Exact byte counts of one step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bytes {
    /// Parameters (persistent), with the batch norms' running statistics.
    pub params: u64,
    /// Complete parameter gradients (each lives until its update).
    pub grads: u64,
    /// Optimizer state (persistent).
    pub optimizer: u64,
    /// Forward values kept for backward.
    pub activations: u64,
    /// Kernel scratch.
    pub workspace: u64,
    /// Per-step inputs.
    pub inputs: u64,
    /// Max over steps of live bytes: no layout can use less.
    pub peak: u64,
    /// Proven lower bound of the layout (at least `peak` up to alignment slack).
    pub lower_bound: u64,
    /// The arena the layout needs.
    pub arena: u64,
    /// Sum of all buffers: the arena without any reuse.
    pub no_reuse: u64,
}

impl Bytes {
    /// The named parts of a step's memory, in report order.
    pub fn parts(&self) -> [(&'static str, u64); 6] {
        [
            ("parameters", self.params),
            ("optimizer state", self.optimizer),
            ("gradients", self.grads),
            ("saved activations", self.activations),
            ("inputs", self.inputs),
            ("workspace", self.workspace),
        ]
    }

    /// The largest part: `(what, bytes)`, e.g. `("optimizer state", 995518464)`.
    pub fn dominant_part(&self) -> (&'static str, u64) {
        self.parts()
            .into_iter()
            .max_by_key(|&(_, v)| v)
            .unwrap_or(("parameters", 0))
    }
}

/// Peak live bytes during one phase.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhasePeak {
    pub phase: Phase,
    pub peak: u64,
}

/// Saved-for-backward values of one op kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedKind {
    pub op: String,
    pub count: u64,
    pub bytes: u64,
}

/// Recomputed values of one op kind in one block (instances merged: `layer` for `layer.3`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecomputedGroup {
    pub op: String,
    pub block: String,
    pub count: u64,
    pub bytes: u64,
}

/// What checkpointing decided: the policy, what it recomputes and what that costs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointSummary {
    /// The policy in words, as the report prints it (`keep all (...)`, `pointwise: ...`,
    /// `block: ...`, `every=K: ...`, `selective: ...`, `min-cut ...`).
    pub policy: String,
    /// Bytes of forward values kept for backward.
    pub kept_bytes: u64,
    /// Bytes of the values recomputed in backward.
    pub recomputed_bytes: u64,
    /// FLOPs spent recomputing (included in the report's total FLOPs).
    pub recompute_flops: u64,
    pub recomputed: Vec<RecomputedGroup>,
}

/// What mixed precision decided: the casts it inserted and whether the loss is scaled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrecisionSummary {
    /// `fp32`, `bf16` or `fp16`.
    pub precision: crate::settings::Precision,
    /// Cast launches in the step (recomputed casts included).
    pub casts: u64,
    /// Bytes the casts write.
    pub cast_bytes: u64,
    /// Of the forward casts, the low-precision copies of weights (casts of values computed
    /// from parameters alone; one per weight in forward, and again in backward for the
    /// weights backward reads).
    pub weight_copies: u64,
    /// Bytes of the weight copies.
    pub weight_copy_bytes: u64,
    /// Whether the step carries dynamic loss scaling (fp16).
    pub loss_scaling: bool,
}

/// What the plan needs and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The model's parameters (under ZeRO-3 the whole tensors', not this rank's shards).
    pub param_count: u64,
    /// Parameters that train (not frozen); equal to `param_count` when none is frozen.
    #[serde(default)]
    pub trainable_param_count: u64,
    pub bytes: Bytes,
    pub phases: Vec<PhasePeak>,
    pub saved: Vec<SavedKind>,
    pub optimizer_in_backward: bool,
    /// Peak bytes saved by updating each parameter as soon as its gradient is complete.
    pub optimizer_in_backward_saving: Option<u64>,
    pub flops: u64,
    pub steps: usize,
    pub layout_optimal: bool,
    pub checkpoint: Option<CheckpointSummary>,
    /// Mixed precision, for training plans in bf16 or fp16.
    #[serde(default)]
    pub precision: Option<PrecisionSummary>,
    /// The estimated step time on the GPU named by `--gpu` (absent when none is named).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<crate::cost::Estimate>,
    /// The ten largest tensors live at the peak, with their source lines (filled by
    /// [`crate::compile`], which has the source).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub largest_at_peak: Vec<super::PeakTensor>,
    /// On a GPU: the device bytes the step takes, its arena and the CUDA context's reserve
    /// (absent for the CPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceBytes>,
    /// The host arena of an offloaded plan (`--offload`): its bytes and what it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<super::HostBytes>,
    /// Bytes an offloaded plan copies between the device and the host per step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfers: Option<super::Transfers>,
    /// Unified memory (`--unified`): what of the arena is resident on the device and where
    /// page faults fall.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unified: Option<super::Unified>,
    /// The frozen weights stored quantized (`--quantize-frozen`), when there are any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantized: Option<QuantSummary>,
    /// Data parallelism: the ranks, their roles and each rank's bytes (absent on one
    /// device).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel: Option<super::ParallelReport>,
}

/// The frozen weights a plan stores quantized: how many, their packed bytes and the bytes
/// they would take unpacked in the precision their matmuls read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuantSummary {
    pub scheme: crate::ir::Scheme,
    /// Quantized weight tensors.
    pub tensors: u64,
    /// Their elements.
    pub weights: u64,
    /// Their packed bytes (part of the parameters' bytes).
    pub packed_bytes: u64,
    /// Their bytes unpacked, in the precision their matmuls read.
    pub unpacked_bytes: u64,
}

/// The device bytes of a plan for a GPU: what the plan guarantees (its arena) and what the
/// runtime takes beside it (the CUDA context with the loaded kernels, a stated figure).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceBytes {
    /// The arena, exact.
    pub arena: u64,
    /// The CUDA context and loaded kernels (`crate::cost::CONTEXT_RESERVE` unless
    /// `--context-reserve` says otherwise).
    pub context_reserve: u64,
    /// NCCL's buffers on each rank of a data-parallel plan (`crate::cost::NCCL_RESERVE`);
    /// 0 on one device.
    #[serde(default, skip_serializing_if = "super::is_zero")]
    pub nccl_reserve: u64,
    /// Their sum: what `--budget` is held to on a GPU.
    pub total: u64,
}

impl Report {
    /// The bytes a budget is held to: the device total on a GPU, else the arena.
    pub fn budgeted_bytes(&self) -> u64 {
        self.device.map_or(self.bytes.arena, |d| d.total)
    }

    /// The recompute FLOPs as a percentage of the step's FLOPs (0 without checkpointing).
    pub fn recompute_percent(&self) -> f64 {
        self.checkpoint
            .as_ref()
            .map_or(0.0, |c| percent_of(c.recompute_flops, self.flops))
    }
}

/// `part` as a percentage of `whole` (0 when `whole` is 0).
fn percent_of(part: u64, whole: u64) -> f64 {
    100.0 * part as f64 / whole.max(1) as f64
}

/// `474.7 MiB` style size with binary units.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// `1,234,567`: digits grouped by thousands.
pub fn grouped(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn row(out: &mut String, label: &str, bytes: u64, note: &str) {
    let _ = writeln!(
        out,
        "  {label:<22} {:>12} {:>20}  {note}",
        human_bytes(bytes),
        grouped(bytes)
    );
}

/// An indented line of `count` values of `bytes` each, after `lead` and before `tail`.
fn count_row(out: &mut String, lead: &str, count: u64, bytes: u64, tail: &str) {
    let _ = writeln!(
        out,
        "    {lead} {count:>6} x {:>12}{tail}",
        human_bytes(bytes)
    );
}

/// The mixed-precision lines of the report.
fn render_precision(out: &mut String, p: &PrecisionSummary) {
    let scaling = if p.loss_scaling {
        ", dynamic loss scaling"
    } else {
        ""
    };
    let _ = writeln!(
        out,
        "  precision: {} (matmul/conv/attention in {0}; fp32 master weights, layer/rms norms, losses, optimizer{scaling})",
        format!("{:?}", p.precision).to_lowercase()
    );
    row(
        out,
        "  casts",
        p.cast_bytes,
        &format!("{} launches", grouped(p.casts)),
    );
    row(
        out,
        "  weight copies",
        p.weight_copy_bytes,
        &format!(
            "{} weights cast in forward; backward casts again those it reads",
            grouped(p.weight_copies)
        ),
    );
}

/// The checkpointing lines of the report (`step_flops`: the FLOPs of the whole step).
fn render_checkpoint(out: &mut String, c: &CheckpointSummary, step_flops: u64) {
    let pct = percent_of(c.recompute_flops, step_flops);
    let _ = writeln!(out, "  checkpointing: {}", c.policy);
    row(out, "  kept for backward", c.kept_bytes, "");
    row(
        out,
        "  recomputed",
        c.recomputed_bytes,
        &format!(
            "{:.3} GFLOP = {pct:.2}% of the step",
            c.recompute_flops as f64 / 1e9
        ),
    );
    for g in &c.recomputed {
        let lead = format!("{:<24} {:<12}", g.op, g.block);
        count_row(out, &lead, g.count, g.bytes, "");
    }
}

/// The report as an aligned table for people.
pub fn render_text(plan: &Plan) -> String {
    let r = &plan.report;
    let b = &r.bytes;
    let mut out = String::new();
    let kind = if plan.train.is_some() {
        "training step"
    } else {
        "inference step"
    };
    let frozen = if plan.train.is_some() && r.trainable_param_count < r.param_count {
        format!(" ({} trainable)", grouped(r.trainable_param_count))
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "model {} ({kind}): {} parameters{frozen}, {} steps, {:.3} GFLOP",
        plan.model,
        grouped(r.param_count),
        r.steps,
        r.flops as f64 / 1e9
    );
    super::summary::render(&mut out, plan);
    let accumulate = plan.train.as_ref().map_or(1, |t| t.accumulate);
    if accumulate > 1 {
        let _ = writeln!(
            out,
            "  gradient accumulation: {accumulate} micro-batches per update (steps, FLOPs, activations and inputs are per micro-batch)"
        );
    }
    let _ = writeln!(out, "  {:<22} {:>12} {:>20}", "memory", "size", "bytes");
    row(&mut out, "params", b.params, "persistent");
    if plan.train.is_some() {
        let grads_note = if accumulate > 1 {
            "fp32 accumulators, persistent"
        } else {
            "each until its update"
        };
        row(&mut out, "grads", b.grads, grads_note);
        let state = match &r.host {
            Some(h) if h.optimizer > 0 => "on the host: the host arena below",
            _ => "persistent",
        };
        row(&mut out, "optimizer state", b.optimizer, state);
        row(
            &mut out,
            "saved activations",
            b.activations,
            "forward values read by backward",
        );
    }
    row(&mut out, "inputs", b.inputs, "bound per step");
    row(&mut out, "workspace", b.workspace, "kernel scratch");
    row(
        &mut out,
        "peak live",
        b.peak,
        "max over steps of live bytes",
    );
    for p in &r.phases {
        row(
            &mut out,
            &format!("  peak in {:?}", p.phase).to_lowercase(),
            p.peak,
            "",
        );
    }
    let ratio = if b.lower_bound > 0 {
        b.arena as f64 / b.lower_bound as f64
    } else {
        1.0
    };
    row(
        &mut out,
        "arena",
        b.arena,
        &format!(
            "{ratio:.4} x lower bound{}",
            if r.layout_optimal { " (optimal)" } else { "" }
        ),
    );
    row(&mut out, "lower bound", b.lower_bound, "");
    row(&mut out, "no reuse", b.no_reuse, "sum of all buffers");
    if let Some(s) = r.optimizer_in_backward_saving {
        row(
            &mut out,
            "optimizer in backward",
            s,
            "peak saved vs updating after backward",
        );
    }
    if !r.saved.is_empty() {
        let _ = writeln!(out, "  saved for backward, by op:");
        for s in &r.saved {
            let tail = format!(" {:>20}", grouped(s.bytes));
            count_row(&mut out, &format!("{:<24}", s.op), s.count, s.bytes, &tail);
        }
    }
    super::host::render(&mut out, r);
    super::unified::render(&mut out, plan);
    super::parallel::render(&mut out, plan);
    super::peak::render(&mut out, &r.largest_at_peak);
    if let Some(p) = &r.precision {
        render_precision(&mut out, p);
    }
    if let Some(q) = &r.quantized {
        let _ = writeln!(
            out,
            "  quantized: {} frozen weights ({} values) in {} as {} ({:.3} bytes per weight) \
             instead of {}: {} saved",
            q.tensors,
            grouped(q.weights),
            q.scheme,
            grouped(q.packed_bytes),
            q.packed_bytes as f64 / q.weights.max(1) as f64,
            grouped(q.unpacked_bytes),
            grouped(q.unpacked_bytes.saturating_sub(q.packed_bytes))
        );
    }
    if let Some(c) = &r.checkpoint {
        render_checkpoint(&mut out, c, r.flops);
    }
    if let Some(e) = &r.estimate {
        crate::cost::render_text(&mut out, e, plan);
    }
    if let Some(t) = plan.train.as_ref().filter(|t| !t.unified) {
        if let Some(budget) = t.budget {
            let fits = if b.arena <= budget {
                "fits"
            } else {
                "does NOT fit"
            };
            let _ = writeln!(
                out,
                "  budget {} ({}): {fits}",
                human_bytes(budget),
                grouped(budget)
            );
        }
    }
    out
}

/// Live bytes at each of `steps` steps, given each buffer's size and inclusive step interval
/// (intervals must lie within `0..steps`).
pub fn live_bytes(steps: usize, spans: impl Iterator<Item = (u64, usize, usize)>) -> Vec<u64> {
    let mut delta = vec![0i128; steps + 1];
    for (bytes, first, last) in spans {
        delta[first] += bytes as i128;
        delta[last + 1] -= bytes as i128;
    }
    let mut acc = 0i128;
    delta[..steps]
        .iter()
        .map(|d| {
            acc += d;
            acc as u64
        })
        .collect()
}
