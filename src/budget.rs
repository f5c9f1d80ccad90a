//! Fitting a step into its budget: plans the graph under a checkpointing policy and, in
//! `auto` mode, takes the smaller plan of keep-all and pointwise recomputation if that fits,
//! else compiles the candidate policies in stages of growing recomputation (selective and
//! min-cut; then per-block, every k-th block, sqrt(n) and min-cuts over a sweep of
//! recomputation penalties) and keeps the fitting plan with the least estimated step time on
//! the chosen GPU (`crate::cost`): the least recompute time, since the steps every candidate
//! shares cost the same. The sweep is exhaustive rather than a bisection because the
//! laid-out peak is not monotone in the penalty: recomputed values also occupy memory during
//! backward. When even that misses the budget, the fused loss head's chunks are halved and
//! the search repeats.

use crate::cost::{estimate, Gpu};
use crate::diagnostic::UserError;
use crate::front::train::TrainSpec;
use crate::ir::cost::flops;
use crate::ir::{Graph, Op, Span, TensorType};
use crate::passes::checkpoint::{self, Policy};
use crate::passes::StageError;
use crate::plan::{
    self, human_bytes, BuildOptions, CheckpointSummary, Plan, RecomputedGroup, Target, TrainSummary,
};
use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroUsize;
use std::time::Duration;

/// How the compiler chooses recomputation (`--checkpoint`). Whatever the mode, casts that
/// widen low-precision activations to fp32 and low-precision weight copies are recomputed
/// rather than saved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CheckpointMode {
    /// The smaller of keep-all and pointwise recomputation when it fits the budget (or there
    /// is none); else the fitting candidate (selective, min-cut, then the first k blocks,
    /// per-block, every k-th block, sqrt(n), min-cut sweeps) with the least estimated step
    /// time ([`auto_candidates`]).
    #[default]
    Auto,
    /// Save every value backward reads (`none`).
    KeepAll,
    /// Recompute pointwise ops and norms from values saved anyway ([`Policy::Pointwise`]).
    Pointwise,
    /// Save the boundary of every k-th block instance (`every=K`; `block` is k = 1).
    Every(NonZeroUsize),
    /// Every k-th block with k = round(sqrt(block instances)) (Chen et al. 2016).
    Sqrt,
    /// Per-block checkpointing of the first k block instances, pointwise elsewhere (`first=K`,
    /// [`Policy::FirstBlocks`]).
    First(NonZeroUsize),
    /// Min-cut with heavy and random ops never recomputed.
    MinCut,
    /// Korthikanti et al.'s selective recomputation: cheap ops inside blocks recomputed,
    /// heavy ops' outputs kept ([`Policy::Selective`]).
    Selective,
    /// Per-block choices by knapsack saving this many bytes beyond pointwise recomputation
    /// (`knapsack=SIZE`, e.g. `knapsack=1GiB` or in bytes, [`Policy::Knapsack`]).
    Knapsack(u64),
}

impl CheckpointMode {
    /// Per-block checkpointing (`block`): every block instance's input saved.
    pub const BLOCK: CheckpointMode = CheckpointMode::Every(NonZeroUsize::MIN);

    /// Parses a `--checkpoint` value: `auto`, `none`, `pointwise`, `block`, `every=K`,
    /// `first=K` (K >= 1), `sqrt`, `mincut`, `selective` or `knapsack=SIZE`. Errors carry a
    /// span into `text` and a help line.
    pub fn parse(text: &str) -> Result<CheckpointMode, UserError> {
        const HELP: &str = "use auto, none, pointwise, block, every=K, first=K (K a positive integer), sqrt, mincut, selective or knapsack=SIZE";
        if let Some(bytes) = text.strip_prefix("knapsack=") {
            let span = Span::new(text.len() - bytes.len(), text.len());
            return parse_size(bytes)
                .map(CheckpointMode::Knapsack)
                .map_err(|why| {
                    UserError::at(
                        span,
                        why,
                        "expected a size",
                        "e.g. knapsack=1GiB recomputes blocks until 1 GiB more than pointwise is saved",
                    )
                });
        }
        Ok(match text {
            "auto" => CheckpointMode::Auto,
            "none" => CheckpointMode::KeepAll,
            "pointwise" => CheckpointMode::Pointwise,
            "block" => CheckpointMode::BLOCK,
            "sqrt" => CheckpointMode::Sqrt,
            "mincut" => CheckpointMode::MinCut,
            "selective" => CheckpointMode::Selective,
            _ => return counted(text, HELP),
        })
    }

    /// The policy of a fixed mode on `graph` (None for auto).
    fn policy(self, graph: &Graph) -> Option<Policy> {
        Some(match self {
            CheckpointMode::Auto => return None,
            CheckpointMode::KeepAll => Policy::KeepAll,
            CheckpointMode::Pointwise => Policy::Pointwise,
            CheckpointMode::Every(k) => Policy::Segments { every: k.get() },
            CheckpointMode::First(k) => Policy::FirstBlocks { count: k.get() },
            CheckpointMode::Sqrt => Policy::Segments {
                every: checkpoint::sqrt_segment(graph),
            },
            CheckpointMode::MinCut => Policy::MinCut { penalty: None },
            CheckpointMode::Selective => Policy::Selective,
            CheckpointMode::Knapsack(saving) => Policy::Knapsack { saving },
        })
    }
}

/// Parses a byte size: a positive number with an optional unit (`16GiB`, `512MiB`, `1.5GB`,
/// `4096`); the error says what is wrong in words.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .trim()
        .parse()
        .ok()
        .filter(|n: &f64| n.is_finite())
        .ok_or_else(|| format!("`{text}` is not a size (e.g. 16GiB)"))?;
    let mult = match unit {
        "" | "B" => 1u64,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => {
            return Err(format!(
                "unknown size unit `{unit}` (use B, KiB, MiB, GiB, KB, MB, GB)"
            ))
        }
    };
    if n <= 0.0 {
        return Err(format!("size `{text}` must be positive"));
    }
    Ok((n * mult as f64) as u64)
}

/// Parses `every=K` or `first=K` (K >= 1); `help` is the list of policies.
fn counted(text: &str, help: &str) -> Result<CheckpointMode, UserError> {
    type Make = fn(NonZeroUsize) -> CheckpointMode;
    let kinds: [(&str, Make, &str); 2] = [
        (
            "every",
            CheckpointMode::Every,
            "e.g. every=2 saves the output of every second block instance",
        ),
        (
            "first",
            CheckpointMode::First,
            "e.g. first=4 recomputes the first four block instances, one at a time",
        ),
    ];
    let whole = Span::new(0, text.len());
    let Some((name, k, make, example)) = kinds
        .into_iter()
        .find_map(|(name, make, example)| Some((name, text.strip_prefix(name)?, make, example)))
    else {
        return Err(UserError::at(
            whole,
            format!("unknown checkpointing policy `{text}`"),
            "not a policy",
            help,
        ));
    };
    let Some(k) = k.strip_prefix('=').filter(|k| !k.is_empty()) else {
        return Err(UserError::at(
            whole,
            format!("`{name}` needs a block count: {name}=K"),
            "no block count",
            example,
        ));
    };
    let span = Span::new(text.len() - k.len(), text.len());
    match k.parse::<usize>().ok().and_then(NonZeroUsize::new) {
        Some(k) => Ok(make(k)),
        None => Err(UserError::at(
            span,
            format!("`{k}` is not a positive block count"),
            "expected an integer of at least 1",
            example,
        )),
    }
}

/// Why no plan was produced.
#[derive(Debug, Clone)]
pub enum FitError {
    User(UserError),
    Internal(StageError),
}

impl From<StageError> for FitError {
    fn from(e: StageError) -> FitError {
        FitError::Internal(e)
    }
}

fn summary(
    policy: Policy,
    graph: &Graph,
    clones: &[(crate::ir::ValueId, crate::ir::ValueId)],
    plan: &Plan,
) -> Option<CheckpointSummary> {
    let name = match policy {
        Policy::KeepAll if clones.is_empty() => return None,
        Policy::KeepAll => {
            "keep all (casts recomputed: fp32 copies of activations, low-precision weight copies)"
                .into()
        }
        Policy::Pointwise => {
            "pointwise: pointwise ops and norms recomputed from values saved anyway".into()
        }
        Policy::MinCut { penalty: None } => "min-cut (heavy and random ops kept)".to_string(),
        Policy::MinCut { penalty: Some(p) } => {
            format!("min-cut, recompute penalty {p:.3e} bytes/FLOP")
        }
        Policy::Segments { every: 1 } => {
            "block: each block instance's input saved, one block recomputed at a time".into()
        }
        Policy::Segments { every } => {
            format!("every={every}: one block instance output in {every} saved")
        }
        Policy::FirstBlocks { count } => format!(
            "first={count}: the first {count} block instances recomputed one at a time from \
             their inputs, pointwise recomputation elsewhere"
        ),
        Policy::Selective => {
            "selective: cheap ops inside blocks recomputed, heavy ops' outputs kept".into()
        }
        Policy::Knapsack { saving } => format!(
            "knapsack={saving}: per block instance, pointwise, selective or whole \
             recomputation, chosen to save {} beyond pointwise for the fewest recomputed FLOPs",
            human_bytes(saving)
        ),
    };
    let mut groups: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
    let mut recompute_flops = 0;
    for &(_, c) in clones {
        let node = graph.node(c);
        // A recomputed activation computed beside its gradient (`passes::unary_pairs`) is
        // counted as the activation alone.
        let (op, inputs) = match node.op {
            Op::Member { .. } => match graph.node(node.inputs[0]).op {
                Op::UnaryPair(f) => (Op::Unary(f), &graph.node(node.inputs[0]).inputs[..1]),
                _ => (node.op.clone(), &node.inputs[..]),
            },
            _ => (node.op.clone(), &node.inputs[..]),
        };
        let types: Vec<&TensorType> = inputs.iter().map(|&i| &graph.node(i).ty).collect();
        recompute_flops += flops(&op, &types, &node.ty);
        let block = node.scope.split('.').next().unwrap_or("").to_string();
        let e = groups
            .entry((
                op.name().to_string(),
                if block.is_empty() {
                    "(top)".into()
                } else {
                    block
                },
            ))
            .or_default();
        e.0 += 1;
        e.1 += node.ty.bytes();
    }
    Some(CheckpointSummary {
        policy: name,
        kept_bytes: plan.report.bytes.activations,
        recomputed_bytes: groups.values().map(|g| g.1).sum(),
        recompute_flops,
        recomputed: groups
            .into_iter()
            .map(|((op, block), (count, bytes))| RecomputedGroup {
                op,
                block,
                count,
                bytes,
            })
            .collect(),
    })
}

/// The plan's record of `train { }`: its settings without their source positions.
impl From<&TrainSpec> for TrainSummary {
    fn from(t: &TrainSpec) -> TrainSummary {
        t.settings.clone()
    }
}

/// The step to plan: for which target, the model's name, its graph, its `train { }`
/// settings (none for inference) and the GPU whose estimated time ranks recomputation.
#[derive(Clone, Copy)]
pub struct Step<'a> {
    /// Where the plan runs.
    pub target: Target,
    /// The model's name, as the report shows it.
    pub model: &'a str,
    /// The graph before checkpointing.
    pub graph: &'a Graph,
    /// The `train { }` settings, if the step trains.
    pub train: Option<&'a TrainSpec>,
    /// The GPU candidates' estimated step times are compared on.
    pub gpu: Gpu,
    /// Device bytes beside the arena that the budget must also hold (the CUDA context on a
    /// GPU; 0 on the CPU).
    pub reserve: u64,
}

/// Plans the step's graph under `policy`, returning the rewritten graph and its plan.
pub fn plan_with(
    step: Step,
    policy: Policy,
    options: &BuildOptions,
) -> Result<(Graph, Plan), StageError> {
    let Step {
        target,
        model,
        graph,
        train,
        ..
    } = step;
    let recompute = checkpoint::choose(graph, policy);
    let rewritten = checkpoint::rewrite(graph, &recompute)?;
    crate::ir::verify(&rewritten.graph).map_err(|e| {
        StageError::internal(
            "checkpoint",
            e.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join("; "),
        )
    })?;
    let offload = train.and_then(|t| t.settings.offload);
    let (graph, clones) = if offload.is_some_and(crate::settings::Offload::activations) {
        let o = crate::passes::offload_activations::run(&rewritten.graph)?;
        let clones = (rewritten.clones.iter())
            .map(|&(v, c)| (v, o.map[c.index()]))
            .collect();
        (o.graph, clones)
    } else {
        (rewritten.graph, rewritten.clones)
    };
    use crate::launch_groups::Costly;
    let planned = |allowed: Costly| -> Result<(Graph, Plan, Costly), StageError> {
        let ((graph, clones), forward_joins) = crate::launch_groups::grouped_if_no_higher(
            graph.clone(),
            clones.clone(),
            (target, train),
            (options, allowed),
        )?;
        let ((graph, clones), add_norms) = crate::launch_groups::pairs_merged_if_no_higher(
            graph,
            clones,
            (target, train),
            (options, allowed),
        )?;
        let summary_of = train.map(TrainSummary::from);
        let clone_ids = clones.iter().map(|&(_, c)| c).collect();
        let mut plan = plan::build_for(
            target,
            model,
            &graph,
            summary_of.as_ref(),
            options,
            &clone_ids,
        )?;
        plan.report.checkpoint = summary(policy, &graph, &clones, &plan);
        let made = Costly {
            forward_joins,
            add_norms,
        };
        Ok((graph, plan, made))
    };
    crate::launch_groups::smallest_of(planned)
}

/// The diagnostic for a budget no plan meets: `arena_budget` is what the budget leaves for
/// the arena beside `reserve` (the CUDA context on a GPU, and NCCL's buffers for a rank of
/// a data-parallel plan).
fn infeasible(train: &TrainSpec, (arena_budget, reserve): (u64, u64), plan: &Plan) -> FitError {
    let (name, bytes) = plan.report.bytes.dominant_part();
    let beside = if reserve > 0 {
        let what = match train.settings.parallel {
            Some(_) => "the CUDA context's and NCCL's",
            None => "the CUDA context's",
        };
        format!(
            " (the arena's share of it beside {what} {}: {})",
            human_bytes(reserve),
            human_bytes(arena_budget)
        )
    } else {
        String::new()
    };
    let message = format!(
        "no plan fits the budget of {}{beside}: the smallest plan found, recomputing as much as allowed, needs {} ({} bytes)",
        human_bytes(arena_budget.saturating_add(reserve)),
        human_bytes(plan.arena_bytes),
        plan.arena_bytes
    );
    let help = format!(
        "the minimum feasible budget found is {}; {name} alone {} {}",
        human_bytes(plan.arena_bytes.saturating_add(reserve)),
        if name.ends_with('s') { "take" } else { "takes" },
        human_bytes(bytes)
    );
    FitError::User(match train.budget_span {
        Some(span) => UserError::at(span, message, "budget set here", help),
        None => UserError::general(message, format!("{help} (the budget is --budget's)")),
    })
}

/// How many knapsack policies auto mode tries at most, spread over the greedy's steps up to
/// every block instance recomputed whole.
const KNAPSACK_STEPS: usize = 16;

/// Auto mode's candidates, in stages of growing recomputation: keep-all and pointwise (the
/// smaller plan of the two is taken, as pointwise recomputation costs memory passes only);
/// the policies that recompute no heavy op (selective, min-cut with heavy ops kept); then
/// the ones that recompute whole blocks, a superset of what selective recomputes: the first
/// k block instances for k at eighths of their number (one more instance recomputed, one
/// more instance's saves gone: the fine steps between pointwise and per-block), per-block
/// and every k-th block for k up to max(4, sqrt(n)) (sqrt(n) among them), and min-cuts over
/// a sweep of recomputation penalties (1e2 down to 1e-13 bytes per FLOP), and knapsacks
/// of per-instance choices saving evenly spaced amounts (`checkpoint::knapsack_savings`).
pub fn auto_candidates(graph: &Graph) -> [Vec<Policy>; 3] {
    let blocks = checkpoint::instances(graph);
    let longest = checkpoint::sqrt_segment(graph).max(4).min(blocks.max(1));
    let mut heavy: Vec<Policy> = (1..8)
        .map(|eighth| (blocks * eighth).div_ceil(8))
        .filter(|&count| count > 0 && count < blocks)
        .collect::<BTreeSet<usize>>()
        .into_iter()
        .map(|count| Policy::FirstBlocks { count })
        .collect();
    heavy.extend((1..=longest).map(|every| Policy::Segments { every }));
    heavy.extend((0..16).map(|i| Policy::MinCut {
        penalty: Some(10f64.powf(2.0 - i as f64)),
    }));
    heavy.extend(
        checkpoint::knapsack_savings(graph, KNAPSACK_STEPS)
            .into_iter()
            .map(|saving| Policy::Knapsack { saving }),
    );
    [
        vec![Policy::KeepAll, Policy::Pointwise],
        vec![Policy::Selective, Policy::MinCut { penalty: None }],
        heavy,
    ]
}

/// A candidate planned with the quick layout: its policy, estimated step time in seconds,
/// arena bytes, and the rewritten graph and plan.
struct Candidate {
    policy: Policy,
    seconds: f64,
    bytes: u64,
    planned: (Graph, Plan),
}

/// The candidates planned with the quick layout, in parallel.
fn plan_candidates(
    step: Step,
    candidates: &[Policy],
    quick: &BuildOptions,
) -> Result<Vec<Candidate>, StageError> {
    use rayon::prelude::*;
    candidates
        .par_iter()
        .map(|&policy| {
            let planned = plan_with(step, policy, quick)?;
            Ok(Candidate {
                policy,
                seconds: estimate(&planned.1, step.gpu).seconds,
                bytes: planned.1.arena_bytes,
                planned,
            })
        })
        .collect()
}

/// Auto mode's choice: the first stage of [`auto_candidates`] with a plan that fits `budget`
/// gives its smallest plan (then the least estimated step time) when it is the first stage,
/// else its plan with the least estimated step time (of times equal up to rounding, the
/// smallest arena); when none fits
/// with the quick layout, the smallest candidate, which then gets the full layout search
/// (and the infeasible diagnostic if it still misses).
fn least_time(
    step: Step,
    budget: Option<u64>,
    quick: &BuildOptions,
) -> Result<Option<Candidate>, StageError> {
    let mut smallest: Option<Candidate> = None;
    for (index, stage) in auto_candidates(step.graph).into_iter().enumerate() {
        let planned = plan_candidates(step, &stage, quick)?;
        let order = |a: &Candidate, b: &Candidate| {
            let time = same_time(a.seconds, b.seconds);
            let bytes = a.bytes.cmp(&b.bytes);
            if index == 0 {
                bytes.then(time)
            } else {
                time.then(bytes)
            }
        };
        let (fitting, rest): (Vec<Candidate>, Vec<Candidate>) = planned
            .into_iter()
            .partition(|c| budget.is_none_or(|b| c.bytes <= b));
        if let Some(best) = fitting.into_iter().min_by(order) {
            return Ok(Some(best));
        }
        smallest = rest
            .into_iter()
            .chain(smallest)
            .min_by(|a, b| a.bytes.cmp(&b.bytes).then(a.seconds.total_cmp(&b.seconds)));
    }
    Ok(smallest)
}

/// The order of two estimated step times, equal where they differ only by rounding (a
/// step bound by its offload copies costs the same whatever backward recomputes, up to the
/// last bits of the sums).
fn same_time(a: f64, b: f64) -> std::cmp::Ordering {
    match (a - b).abs() <= 1e-9 * a.abs().max(b.abs()) {
        true => std::cmp::Ordering::Equal,
        false => a.total_cmp(&b),
    }
}

/// Plans the step: the policy of `mode`, or in auto mode the plan [`least_time`]
/// chooses (the smaller of keep-all and pointwise without a budget). Fails with a
/// diagnostic naming the minimum feasible budget found.
pub fn fit(
    step: Step,
    mode: CheckpointMode,
    options: &BuildOptions,
) -> Result<(Graph, Plan), FitError> {
    let Step { graph, train, .. } = step;
    // The arena gets what the budget leaves beside the reserve; under unified memory the
    // budget is the device's capacity, which the arena may exceed (the driver pages).
    let budget = train
        .filter(|t| !t.settings.unified)
        .and_then(|t| t.settings.budget)
        .map(|b| b.saturating_sub(step.reserve));
    let quick = BuildOptions {
        layout_time: Duration::ZERO,
        ..options.clone()
    };
    // A candidate whose quick layout already reaches the lower bound is the plan the full
    // search would give; any other is planned again with the search.
    let (policy, (g, plan)) = match mode.policy(graph) {
        Some(policy) => (policy, plan_with(step, policy, options)?),
        None => match least_time(step, budget, &quick)? {
            Some(c) if c.planned.1.report.layout_optimal => (c.policy, c.planned),
            chosen => {
                let policy = chosen.map_or(Policy::KeepAll, |c| c.policy);
                (policy, plan_with(step, policy, options)?)
            }
        },
    };
    match (train, budget) {
        // Over budget: the fused loss head's chunks halve (less scratch) until this plan's
        // policy, planned alone, could fit (its lower bound is within the budget); the step
        // is then planned again in `mode` at that chunk size.
        (Some(t), Some(b)) if plan.arena_bytes > b => {
            let mut smallest = plan;
            let mut smaller = crate::passes::fuse_loss::halve_chunks(graph);
            while let Some(halved) = smaller {
                let at = Step {
                    graph: &halved,
                    ..step
                };
                let (_, p) = plan_with(at, policy, &quick)?;
                if p.report.bytes.lower_bound <= b {
                    return fit(at, mode, options);
                }
                if p.arena_bytes < smallest.arena_bytes {
                    smallest = p;
                }
                smaller = crate::passes::fuse_loss::halve_chunks(&halved);
            }
            Err(infeasible(t, (b, step.reserve), &smallest))
        }
        _ => Ok((g, plan)),
    }
}
