//! `memc advise`: what each memory-saving option does to one model, every row a compiled
//! plan: its arena bytes (exact), the extra compute it costs, and its estimated step time on
//! a GPU (`crate::cost`: an estimate, not a measurement), by which rows that fit rank.

use crate::budget::CheckpointMode;
use crate::fit::{fit_accumulation, fit_dim};
use crate::settings::Precision;
use crate::{CompileError, Options};
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
    /// What the row changes, as `memc compile` flags added to the command line advised on.
    pub flags: Vec<String>,
    /// What the row's plan keeps in host memory: its `--offload`, or what the least
    /// estimated time within the budget put there ([`crate::compile_or_offload`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offload: Option<crate::settings::Offload>,
    /// The row fits, keeps the batch, and no other such row is at most as large and at most
    /// as slow (estimated) while smaller or faster: the frontier of bytes against time.
    pub frontier: bool,
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
            flags: Vec::new(),
            offload: None,
            frontier: false,
        }
    }
}

/// Command-line flags from `&str` pieces.
fn flags(pieces: &[&str]) -> Vec<String> {
    pieces.iter().map(|p| p.to_string()).collect()
}

fn row(
    source: &str,
    (option, flags): (&str, Vec<String>),
    options: Options,
    budget: u64,
    note: &str,
) -> Advice {
    // As `memc compile` does with the row's flags: offload weighed against checkpointing.
    match crate::compile_or_offload(source, &options) {
        Ok((c, offload)) => {
            let extra = c.plan.plan().report.recompute_percent();
            let arena = c.plan.plan().arena_bytes;
            let gpu = options.gpu.unwrap_or_default();
            let estimate = crate::cost::estimate(c.plan.plan(), gpu);
            let unified = c.plan.plan().report.unified.as_ref();
            let mut note = match (&estimate.offload, unified) {
                (Some(o), _) => format!(
                    "{note}: offload adds {} to the step",
                    crate::cost::ms(o.extra_seconds)
                ),
                (None, Some(u)) => format!(
                    "{note}: {} of the arena paged to the host, {} page faults adding {}",
                    crate::plan::human_bytes(u.paged_out),
                    crate::plan::grouped(u.faults),
                    crate::cost::ms(u.time.seconds)
                ),
                (None, None) => note.to_string(),
            };
            if let Some(r) = c.plan.plan().report.parallel.as_ref() {
                note.push_str(&per_rank(r));
            }
            if let Some(o) = offload {
                note.push_str(&format!(
                    "; keeps {} in host memory, the least estimated time (--offload {})",
                    o.what(),
                    o.word()
                ));
            }
            Advice {
                option: option.to_string(),
                arena_bytes: Some(arena),
                fits: unified.is_some() || c.plan.plan().report.budgeted_bytes() <= budget,
                extra_compute_percent: extra,
                step_seconds: Some(estimate.seconds),
                keeps_batch: true,
                note,
                flags,
                offload: (c.plan.plan().train.as_ref().and_then(|t| t.offload)).filter(|o| o.any()),
                frontier: false,
            }
        }
        Err(CompileError::User(e)) => Advice::failed(option, true, e.message),
        Err(CompileError::Internal(e)) => Advice::failed(option, true, e.join("; ")),
    }
}

/// Compiles the model under each option against `budget` and returns the rows, best first:
/// plans that fit before those that do not, then those keeping the batch size, then by
/// estimated step time (rows without a plan last), then by bytes. Rows combine knobs where
/// one alone may not fit: bf16 and pure bf16 with checkpointing fitted to the budget, and the
/// largest batch with both. Each row says the flags that select it and whether it is on the
/// frontier of bytes against estimated time. Each row compiles as `memc compile` with its
/// flags does ([`crate::compile_or_offload`]): a row with a budget keeps what the least
/// estimated time puts in host memory, and says so. For a CUDA target one more row keeps the
/// arena in unified memory with the budget as the device's capacity: it fits by paging, at
/// the estimated cost of its page faults; every other row plans without unified memory.
pub fn advise(source: &str, options: &Options, budget: u64) -> Vec<Advice> {
    let options = &Options {
        unified: Some(false),
        ..options.clone()
    };
    let with =
        |checkpoint: CheckpointMode, in_backward: Option<bool>, budget: Option<u64>| Options {
            checkpoint,
            optimizer_in_backward: in_backward.or(options.optimizer_in_backward),
            budget,
            ..options.clone()
        };
    let budget_flag = budget.to_string();
    let keep_all = with(CheckpointMode::KeepAll, None, None);
    let mut rows = vec![
        row(
            source,
            ("keep every activation", flags(&["--checkpoint", "none"])),
            keep_all.clone(),
            budget,
            "the naive plan",
        ),
        row(
            source,
            (
                "optimizer after backward",
                flags(&["--checkpoint", "none", "--optimizer-in-backward", "off"]),
            ),
            with(CheckpointMode::KeepAll, Some(false), None),
            budget,
            "all gradients coexist",
        ),
        row(
            source,
            (
                "8-bit AdamW state",
                flags(&["--checkpoint", "none", "--optimizer-state", "int8"]),
            ),
            Options {
                optimizer_state: Some(crate::ops::optimizer::StateFormat::Int8),
                ..keep_all.clone()
            },
            budget,
            "block-wise 8-bit moments: 2 bytes a parameter",
        ),
    ];
    for (mode, option, policy, note) in [
        (
            CheckpointMode::BLOCK,
            "per-block checkpointing",
            "block",
            "each block's input saved",
        ),
        (
            CheckpointMode::Sqrt,
            "sqrt(n) block checkpointing",
            "sqrt",
            "Chen et al. 2016",
        ),
        (
            CheckpointMode::Selective,
            "selective recomputation",
            "selective",
            "Korthikanti et al. 2022: cheap ops in blocks",
        ),
        (
            CheckpointMode::MinCut,
            "min-cut checkpointing",
            "mincut",
            "recomputes cheap ops only",
        ),
    ] {
        let selects = (option, flags(&["--checkpoint", policy]));
        rows.push(row(source, selects, with(mode, None, None), budget, note));
    }
    let fitted = with(CheckpointMode::Auto, None, Some(budget));
    rows.extend(offload_rows(source, (&keep_all, &fitted), budget));
    if options.target != crate::plan::Target::Cpu {
        let unified = Options {
            unified: Some(true),
            budget: Some(budget),
            ..options.clone()
        };
        let selects = flags(&["--unified", "--budget", &budget_flag]);
        let note = "cudaMallocManaged: the driver pages the arena, LRU over 2 MiB pages";
        let option = ("unified memory", selects);
        rows.push(row(source, option, unified, budget, note));
    }
    rows.extend(layout_rows(source, &fitted, budget));
    let precisions = [
        (Precision::Fp32, true, "", "the file's precision"),
        (Precision::Bf16, true, "bf16", "bf16 mixed precision"),
        (Precision::Bf16, false, "bf16", "pure bf16"),
    ];
    for (precision, master_weights, name, label) in precisions {
        let mut selects = vec!["--budget", budget_flag.as_str()];
        if precision != Precision::Fp32 {
            selects.extend(["--precision", name]);
        }
        if !master_weights {
            selects.extend(["--master-weights", "off"]);
        }
        let option = if precision == Precision::Fp32 {
            "checkpointing fitted to the budget".to_string()
        } else {
            format!("{label} + checkpointing to fit")
        };
        let o = if precision == Precision::Fp32 {
            fitted.clone()
        } else {
            Options {
                precision: Some(precision),
                master_weights: Some(master_weights),
                ..fitted.clone()
            }
        };
        let note = "the least estimated time that fits";
        rows.push(row(source, (&option, flags(&selects)), o, budget, note));
    }
    let adapted = Options {
        lora: Some(crate::passes::lora::LoraSpec {
            rank: 16,
            alpha: 16.0,
            targets: Vec::new(),
        }),
        ..fitted.clone()
    };
    let selects = flags(&["--lora", "r=16", "--budget", &budget_flag]);
    let note = "adapters on every block linear, the model frozen";
    rows.push(row(
        source,
        ("LoRA r=16 + checkpointing to fit", selects),
        adapted.clone(),
        budget,
        note,
    ));
    let qlora = Options {
        precision: Some(Precision::Bf16),
        quantize_frozen: Some(crate::ir::Scheme::Nf4),
        ..adapted
    };
    let selects = flags(&[
        "--lora",
        "r=16",
        "--quantize-frozen",
        "nf4",
        "--precision",
        "bf16",
        "--budget",
        &budget_flag,
    ]);
    let note = "QLoRA: the frozen base in 4-bit NormalFloat";
    rows.push(row(
        source,
        (
            "QLoRA r=16 (nf4 base, bf16) + checkpointing to fit",
            selects,
        ),
        qlora,
        budget,
        note,
    ));
    rows.extend(precision_rows(source, &keep_all, budget));
    rows.push(accumulation_row(source, &keep_all, budget));
    let bf16 = |o: Options| Options {
        precision: Some(Precision::Bf16),
        ..o
    };
    let auto = with(CheckpointMode::Auto, None, None);
    for (o, label, changes) in [
        (
            keep_all,
            "without recomputation",
            vec!["--checkpoint", "none"],
        ),
        (auto.clone(), "with checkpointing", vec![]),
        (
            bf16(auto),
            "with bf16 and checkpointing",
            vec!["--precision", "bf16"],
        ),
    ] {
        rows.push(largest_batch_row(source, &o, (label, &changes), budget));
    }
    mark_frontier(&mut rows);
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

/// Marks the rows that fit, keep the batch, and are not dominated in (bytes, time) by
/// another such row.
fn mark_frontier(rows: &mut [Advice]) {
    let points: Vec<Option<(u64, f64)>> = rows
        .iter()
        .map(
            |r| match (r.fits && r.keeps_batch, r.arena_bytes, r.step_seconds) {
                (true, Some(a), Some(t)) => Some((a, t)),
                _ => None,
            },
        )
        .collect();
    for (r, p) in rows.iter_mut().zip(&points) {
        r.frontier = p.is_some_and(|(a, t)| {
            !points
                .iter()
                .flatten()
                .any(|&(b, u)| b <= a && u <= t && (b < a || u < t))
        });
    }
}

/// The rows with the optimizer state in host memory (`--offload optimizer`) and with every
/// saved activation in host memory (`--offload activations`), each keeping every
/// activation (`keep_all`) and with checkpointing fitted to the budget (`fitted`): their
/// estimated time includes the copies and the host updates, so they rank first only
/// where they win.
fn offload_rows(
    source: &str,
    (keep_all, fitted): (&Options, &Options),
    budget: u64,
) -> Vec<Advice> {
    use crate::settings::Offload;
    let budget_flag = budget.to_string();
    let state = "state in host memory, updated by the CPU";
    let saved = "what backward reads waits in host memory";
    let keep = ["--checkpoint", "none"];
    [
        (
            "optimizer on the host",
            Offload::Optimizer,
            keep_all,
            keep,
            state,
        ),
        (
            "optimizer on the host + checkpointing to fit",
            Offload::Optimizer,
            fitted,
            ["--budget", &budget_flag],
            state,
        ),
        (
            "activations on the host",
            Offload::Activations,
            keep_all,
            keep,
            saved,
        ),
        (
            "activations on the host + checkpointing to fit",
            Offload::Activations,
            fitted,
            ["--budget", &budget_flag],
            saved,
        ),
    ]
    .into_iter()
    .map(|(option, offload, base, more, note)| {
        let word = offload.word();
        let o = Options {
            offload: Some(offload),
            ..base.clone()
        };
        let selects = flags(&[&["--offload", word][..], &more[..]].concat());
        row(source, (option, selects), o, budget, note)
    })
    .collect()
}

/// `; per rank: ...`: each rank's params, grads, optimizer state and activations.
fn per_rank(r: &crate::plan::ParallelReport) -> String {
    let Some(b) = r.per_rank.first().map(|e| e.bytes) else {
        return String::new();
    };
    let h = crate::plan::human_bytes;
    format!(
        "; per rank: params {}, grads {}, optimizer {}, activations {}",
        h(b.params),
        h(b.grads),
        h(b.optimizer),
        h(b.activations)
    )
}

/// With data parallelism over N ranks (`--parallel data=N`, N > 1, or any layout of more
/// than one rank), the other layouts, each with checkpointing fitted to the budget
/// (`fitted`): every other ZeRO stage over N ranks, ZeRO-3 over N / 2 (from 2) and 2N ranks
/// (up to [`crate::parallel::MAX_RANKS`]), and the same GPUs split Megatron's way over
/// tensor = 2, 4 and 8 ranks per replica where they divide them (the stage kept while more
/// than one replica remains); nothing on one rank. Their arenas are per rank.
fn layout_rows(source: &str, fitted: &Options, budget: u64) -> Vec<Advice> {
    let Some(given) = fitted.parallel.filter(|p| p.world() > 1) else {
        return Vec::new();
    };
    let n = given.data;
    let stages = (0..=3u8)
        .filter(|&z| z != given.zero)
        .map(|z| (n, given.tensor, z));
    let counts = [n / 2, n.saturating_mul(2)].into_iter();
    let counts = counts.filter(|&d| (2..=crate::parallel::MAX_RANKS).contains(&d) && d != n);
    let world = given.world();
    let tensors = [2, 4, 8]
        .into_iter()
        .filter(|&t| world % t == 0 && t != given.tensor);
    let splits = tensors.map(|t| (world / t, t, if world > t { given.zero } else { 0 }));
    let budget_flag = budget.to_string();
    (stages
        .chain(counts.map(|d| (d, given.tensor, 3)))
        .chain(splits))
    .map(|(data, tensor, zero)| {
        let (layout, option) = match tensor {
            1 => (
                format!("data={data},zero={zero}"),
                format!("data = {data}, ZeRO-{zero} + checkpointing to fit"),
            ),
            t => (
                format!("data={data},zero={zero},tensor={t}"),
                format!("data = {data}, tensor = {t}, ZeRO-{zero} + checkpointing to fit"),
            ),
        };
        let selects = flags(&["--parallel", &layout, "--budget", &budget_flag]);
        let parallel = crate::parallel::Parallel {
            data,
            zero,
            tensor,
            ..given
        };
        let o = Options {
            parallel: Some(parallel),
            ..fitted.clone()
        };
        let note = "another parallel layout, bytes per rank";
        row(source, (&option, selects), o, budget, note)
    })
    .collect()
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
        let name = if precision == Precision::Fp16 {
            "fp16"
        } else {
            "bf16"
        };
        let mut selects = vec!["--checkpoint", "none", "--precision", name];
        if !master_weights {
            selects.extend(["--master-weights", "off"]);
        }
        let o = Options {
            precision: Some(precision),
            master_weights: Some(master_weights),
            ..base.clone()
        };
        row(source, (option, flags(&selects)), o, budget, note)
    })
    .collect()
}

/// The row that keeps batch `B` by accumulating gradients over micro-batches that fit.
fn accumulation_row(source: &str, keep_all: &Options, budget: u64) -> Advice {
    const OPTION: &str = "gradient accumulation";
    match fit_accumulation(source, keep_all, "B", budget, &mut |_| {}) {
        Ok(f) => {
            let o = Options {
                accumulate: Some(f.accumulate),
                ..keep_all.clone().with_override("B", f.micro_batch)
            };
            let (micro, count) = (format!("B={}", f.micro_batch), f.accumulate.to_string());
            let selects = flags(&[
                "--checkpoint",
                "none",
                "--set",
                &micro,
                "--accumulate",
                &count,
            ]);
            let mut advice = row(source, (OPTION, selects), o, budget, "");
            advice.note = if f.accumulate == 1 {
                format!("B = {} fits without accumulating", f.batch)
            } else {
                format!(
                    "B = {} as {} micro-batches of {}",
                    f.batch, f.accumulate, f.micro_batch
                )
            };
            advice
        }
        Err(e) => Advice::failed(OPTION, true, e.to_string()),
    }
}

/// The row with the largest batch `B` that fits under `options` (`label` says how, and
/// `changes` are the flags of `options` besides the batch).
fn largest_batch_row(
    source: &str,
    options: &Options,
    (label, changes): (&str, &[&str]),
    budget: u64,
) -> Advice {
    let name = format!("largest batch {label}");
    match fit_dim(source, options, "B", budget) {
        Ok(f) => {
            // The search offloads (what reaches the largest batch) when nothing fits without it.
            let offload =
                (f.plan.plan().train.as_ref().and_then(|t| t.offload)).filter(|o| o.any());
            let o = Options {
                budget: Some(budget),
                offload: offload.or(options.offload),
                ..options.clone()
            };
            let (batch, budget_flag) = (format!("B={}", f.value), budget.to_string());
            let mut selects = flags(changes);
            if let Some(o) = offload {
                selects.extend(flags(&["--offload", o.word()]));
            }
            selects.extend(flags(&["--set", &batch, "--budget", &budget_flag]));
            let mut advice = row(
                source,
                (&name, selects),
                o.with_override("B", f.value),
                budget,
                "",
            );
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
