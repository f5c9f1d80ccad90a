//! `memc advise`: what each memory-saving option does to one model, every row a compiled
//! plan: its arena bytes (exact), the extra compute it costs, and its estimated step time on
//! a GPU (`crate::cost`: an estimate, not a measurement), by which rows that fit rank.

use crate::budget::CheckpointMode;
use crate::fit::{fit_accumulation, fit_dim};
use crate::settings::Precision;
use crate::{compile, CompileError, Options};
use serde::Serialize;

/// One option and the plan it gives.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Advice {
    pub option: String,
    /// Arena of the compiled plan, when it compiled.
    pub arena_bytes: Option<u64>,
    pub fits: bool,
    /// Recompute FLOPs as a percentage of the plan's FLOPs.
    pub extra_compute_percent: f64,
    /// The plan's estimated step time in seconds on the options' GPU (the H100 when none
    /// is named), when it compiled.
    pub step_seconds: Option<f64>,
    /// False for rows that reach the budget by changing the batch size.
    pub keeps_batch: bool,
    pub note: String,
}

impl Advice {
    /// A row whose option produced no plan, saying why in `note`.
    fn failed(option: &str, keeps_batch: bool, note: String) -> Advice {
        Advice {
            option: option.to_string(),
            arena_bytes: None,
            fits: false,
            extra_compute_percent: 0.0,
            step_seconds: None,
            keeps_batch,
            note,
        }
    }
}

fn row(source: &str, option: &str, options: Options, budget: u64, note: &str) -> Advice {
    match compile(source, &options) {
        Ok(c) => {
            let r = &c.plan.plan().report;
            let extra = r.checkpoint.as_ref().map_or(0.0, |s| {
                100.0 * s.recompute_flops as f64 / r.flops.max(1) as f64
            });
            let arena = c.plan.plan().arena_bytes;
            let gpu = options.gpu.unwrap_or_default();
            Advice {
                option: option.to_string(),
                arena_bytes: Some(arena),
                fits: arena <= budget,
                extra_compute_percent: extra,
                step_seconds: Some(crate::cost::estimate(c.plan.plan(), gpu).seconds),
                keeps_batch: true,
                note: note.to_string(),
            }
        }
        Err(CompileError::User(e)) => Advice::failed(option, true, e.message),
        Err(CompileError::Internal(e)) => Advice::failed(option, true, e.join("; ")),
    }
}

/// Compiles the model under each option against `budget` and returns the rows, best first:
/// plans that fit before those that do not, then those keeping the batch size, then by
/// estimated step time (rows without a plan last), then by bytes.
pub fn advise(source: &str, options: &Options, budget: u64) -> Vec<Advice> {
    let with =
        |checkpoint: CheckpointMode, in_backward: Option<bool>, budget: Option<u64>| Options {
            checkpoint,
            optimizer_in_backward: in_backward.or(options.optimizer_in_backward),
            budget,
            ..options.clone()
        };
    let mut rows = vec![
        row(
            source,
            "keep every activation",
            with(CheckpointMode::KeepAll, None, None),
            budget,
            "the naive plan",
        ),
        row(
            source,
            "optimizer after backward",
            with(CheckpointMode::KeepAll, Some(false), None),
            budget,
            "all gradients coexist",
        ),
    ];
    for (mode, option, note) in [
        (
            CheckpointMode::BLOCK,
            "per-block checkpointing",
            "each block's input saved (--checkpoint block)",
        ),
        (
            CheckpointMode::Sqrt,
            "sqrt(n) block checkpointing",
            "Chen et al. 2016 (--checkpoint sqrt)",
        ),
        (
            CheckpointMode::Selective,
            "selective recomputation",
            "Korthikanti et al. 2022: cheap ops in blocks (--checkpoint selective)",
        ),
        (
            CheckpointMode::MinCut,
            "min-cut checkpointing",
            "recomputes cheap ops only (--checkpoint mincut)",
        ),
        (
            CheckpointMode::Auto,
            "checkpointing fitted to the budget",
            "least recompute that fits",
        ),
    ] {
        let fitted = (mode == CheckpointMode::Auto).then_some(budget);
        rows.push(row(source, option, with(mode, None, fitted), budget, note));
    }
    rows.extend(precision_rows(
        source,
        &with(CheckpointMode::KeepAll, None, None),
        budget,
    ));
    rows.push(accumulation_row(
        source,
        &with(CheckpointMode::KeepAll, None, None),
        budget,
    ));
    for (mode, label) in [
        (CheckpointMode::KeepAll, "without recomputation"),
        (CheckpointMode::Auto, "with checkpointing"),
    ] {
        rows.push(largest_batch_row(
            source,
            &with(mode, None, None),
            label,
            budget,
        ));
    }
    rows.sort_by(|a, b| {
        b.fits
            .cmp(&a.fits)
            .then(b.keeps_batch.cmp(&a.keeps_batch))
            .then(
                a.step_seconds
                    .unwrap_or(f64::INFINITY)
                    .total_cmp(&b.step_seconds.unwrap_or(f64::INFINITY)),
            )
            .then(
                a.arena_bytes
                    .unwrap_or(u64::MAX)
                    .cmp(&b.arena_bytes.unwrap_or(u64::MAX)),
            )
    });
    rows
}

/// The mixed- and low-precision rows, each on top of `base`.
fn precision_rows(source: &str, base: &Options, budget: u64) -> Vec<Advice> {
    [
        (
            Precision::Bf16,
            true,
            "bf16 mixed precision",
            "fp32 master weights",
        ),
        (
            Precision::Fp16,
            true,
            "fp16 mixed precision",
            "dynamic loss scaling",
        ),
        (
            Precision::Bf16,
            false,
            "pure bf16",
            "bf16 weights, updates rounded to bf16",
        ),
    ]
    .into_iter()
    .map(|(precision, master_weights, option, note)| {
        let o = Options {
            precision: Some(precision),
            master_weights: Some(master_weights),
            ..base.clone()
        };
        row(source, option, o, budget, note)
    })
    .collect()
}

/// The row that keeps batch `B` by accumulating gradients over micro-batches that fit.
fn accumulation_row(source: &str, keep_all: &Options, budget: u64) -> Advice {
    match fit_accumulation(source, keep_all, "B", budget, &mut |_| {}) {
        Ok(f) => {
            let o = Options {
                accumulate: Some(f.accumulate),
                ..keep_all.clone().with_override("B", f.micro_batch)
            };
            let mut advice = row(source, "gradient accumulation", o, budget, "");
            advice.note = format!(
                "B = {} as {} micro-batches of {}",
                f.batch, f.accumulate, f.micro_batch
            );
            advice
        }
        Err(e) => Advice::failed("gradient accumulation", true, e.to_string()),
    }
}

/// The row with the largest batch `B` that fits under `options` (`label` says how).
fn largest_batch_row(source: &str, options: &Options, label: &str, budget: u64) -> Advice {
    let name = format!("largest batch {label}");
    match fit_dim(source, options, "B", budget) {
        Ok(f) => {
            let o = Options {
                budget: Some(budget),
                ..options.clone()
            };
            let mut advice = row(source, &name, o.with_override("B", f.value), budget, "");
            advice.note = format!("B = {} (from B = {})", f.value, f.start);
            advice.keeps_batch = f.value == f.start;
            advice
        }
        Err(e) => Advice::failed(&name, false, e.to_string()),
    }
}

impl Options {
    /// These options with one more `--set NAME=VALUE` (replacing an earlier one).
    pub fn with_override(mut self, name: &str, value: i64) -> Options {
        self.overrides.retain(|(n, _)| n != name);
        self.overrides.push((name.to_string(), value));
        self
    }
}
