//! Fitting a step into its budget: plans the graph under a checkpointing policy and, in
//! `auto` mode, keeps everything if that fits, else min-cut with heavy ops kept, else the
//! candidate with the least recompute FLOPs that fits among sqrt(n)-style segments and
//! min-cuts over a sweep of recomputation penalties (1e2 down to 1e-13 bytes per FLOP).
//! The sweep is exhaustive rather than a bisection because the laid-out peak is not
//! monotone in the penalty: recomputed values also occupy memory during backward. When even
//! that misses the budget, the fused loss head's chunks are halved and the search repeats.

use crate::diagnostic::UserError;
use crate::front::train::TrainSpec;
use crate::ir::cost::flops;
use crate::ir::{Graph, TensorType};
use crate::passes::checkpoint::{self, Policy};
use crate::passes::StageError;
use crate::plan::{
    self, human_bytes, BuildOptions, CheckpointSummary, Plan, RecomputedGroup, Target, TrainSummary,
};
use std::collections::BTreeMap;
use std::time::Duration;

/// How the compiler chooses recomputation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CheckpointMode {
    /// Keep everything unless the budget demands more; then min-cut, then heavy ops too.
    #[default]
    Auto,
    KeepAll,
    /// Min-cut with heavy and random ops never recomputed.
    MinCut,
    /// Save every k-th block output (k = round(sqrt(blocks)) when 0).
    Segments(usize),
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
        Policy::KeepAll => return None,
        Policy::MinCut { penalty: None } => "min-cut (heavy and random ops kept)".to_string(),
        Policy::MinCut { penalty: Some(p) } => {
            format!("min-cut, recompute penalty {p:.3e} bytes/FLOP")
        }
        Policy::Segments { every } => {
            format!("save every {every}-th block output (sqrt(n) segments)")
        }
    };
    let mut groups: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
    let mut recompute_flops = 0;
    for &(_, c) in clones {
        let node = graph.node(c);
        let types: Vec<&TensorType> = node.inputs.iter().map(|&i| &graph.node(i).ty).collect();
        recompute_flops += flops(&node.op, &types, &node.ty);
        let block = node.scope.split('.').next().unwrap_or("").to_string();
        let e = groups
            .entry((
                node.op.name().to_string(),
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

/// The step to plan: for which target, the model's name, its graph and its `train { }`
/// settings (none for inference).
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
    let train = train.map(TrainSummary::from);
    let mut plan = plan::build_for(target, model, &rewritten.graph, train.as_ref(), options)?;
    plan.report.checkpoint = summary(policy, &rewritten.graph, &rewritten.clones, &plan);
    Ok((rewritten.graph, plan))
}

fn infeasible(train: &TrainSpec, budget: u64, plan: &Plan) -> FitError {
    let (name, bytes) = plan.report.bytes.dominant_part();
    FitError::User(UserError::at(
        train.span,
        format!(
            "no plan fits the budget of {}: the smallest plan found, recomputing as much as allowed, needs {} ({} bytes)",
            human_bytes(budget),
            human_bytes(plan.arena_bytes),
            plan.arena_bytes
        ),
        "budget set here",
        format!("the minimum feasible budget found is {}; {name} alone take {}", human_bytes(plan.arena_bytes), human_bytes(bytes)),
    ))
}

/// Plans the step: the policy of `mode`, or in auto mode the least recomputation that fits
/// the budget. Fails with a diagnostic naming the minimum feasible budget found.
pub fn fit(
    step: Step,
    mode: CheckpointMode,
    options: &BuildOptions,
) -> Result<(Graph, Plan), FitError> {
    let Step { graph, train, .. } = step;
    let budget = train.and_then(|t| t.settings.budget);
    let fixed = match mode {
        CheckpointMode::KeepAll => Some(Policy::KeepAll),
        CheckpointMode::MinCut => Some(Policy::MinCut { penalty: None }),
        CheckpointMode::Segments(k) => Some(Policy::Segments {
            every: if k == 0 {
                checkpoint::sqrt_segment(graph)
            } else {
                k
            },
        }),
        CheckpointMode::Auto => None,
    };
    let quick = BuildOptions {
        layout_time: Duration::ZERO,
        ..options.clone()
    };
    let fits = |p: &Plan| budget.is_none_or(|b| p.arena_bytes <= b);
    let chosen = match fixed {
        Some(policy) => policy,
        None => {
            let mut chosen = None;
            for policy in [Policy::KeepAll, Policy::MinCut { penalty: None }] {
                let (_, p) = plan_with(step, policy, &quick)?;
                if fits(&p) {
                    chosen = Some(policy);
                    break;
                }
            }
            match chosen {
                Some(p) => p,
                None => {
                    let every = checkpoint::sqrt_segment(graph);
                    let mut candidates: Vec<Policy> = (1..=every.max(2))
                        .map(|every| Policy::Segments { every })
                        .collect();
                    candidates.extend((0..16).map(|i| Policy::MinCut {
                        penalty: Some(10f64.powf(2.0 - i as f64)),
                    }));
                    let mut best: Option<(u64, Policy)> = None;
                    let mut smallest: Option<(u64, Policy)> = None;
                    use rayon::prelude::*;
                    let plans = candidates
                        .par_iter()
                        .map(|&policy| plan_with(step, policy, &quick).map(|(_, p)| (policy, p)))
                        .collect::<Result<Vec<_>, _>>()?;
                    for (policy, p) in plans {
                        let cost = p
                            .report
                            .checkpoint
                            .as_ref()
                            .map_or(0, |c| c.recompute_flops);
                        if fits(&p) && best.is_none_or(|(c, _)| cost < c) {
                            best = Some((cost, policy));
                        }
                        if smallest.is_none_or(|(bytes, _)| p.arena_bytes < bytes) {
                            smallest = Some((p.arena_bytes, policy));
                        }
                    }
                    // Nothing fits with the quick layout: the smallest candidate gets the full
                    // layout search below, and the infeasible diagnostic if it still misses.
                    match best.or(smallest) {
                        Some((_, policy)) => policy,
                        None => Policy::KeepAll,
                    }
                }
            }
        }
    };
    let (g, plan) = plan_with(step, chosen, options)?;
    match (train, budget) {
        // Over budget: the fused loss head's chunks halve (less scratch) while they can.
        (Some(t), Some(b)) if plan.arena_bytes > b => {
            match crate::passes::fuse_loss::halve_chunks(graph) {
                Some(smaller) => fit(
                    Step {
                        graph: &smaller,
                        ..step
                    },
                    mode,
                    options,
                ),
                None => Err(infeasible(t, b, &plan)),
            }
        }
        _ => Ok((g, plan)),
    }
}
