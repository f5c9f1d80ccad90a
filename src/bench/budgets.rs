//! Auto checkpointing over a sweep of budgets, from the keep-all plan's arena down to the
//! smallest plan any fixed policy reaches: whether every plan is within its budget, whether
//! the sequence is monotone (bytes never rise, recompute never falls as the budget falls),
//! and how much of each budget the plan uses.

use crate::budget::CheckpointMode;
use crate::{compile, Options};
use std::num::NonZeroUsize;

/// One budget of the sweep and the plan auto mode chose for it.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetPoint {
    /// The budget in bytes.
    pub budget: u64,
    /// The chosen plan's arena, or `None` when no plan fits.
    pub arena: Option<u64>,
    /// The plan's recompute FLOPs (0 without a plan).
    pub recompute_flops: u64,
    /// The recompute FLOPs as a percentage of the plan's (0 without a plan).
    pub recompute_percent: f64,
    /// The plan's policy, as the report names it.
    pub policy: String,
}

impl BudgetPoint {
    /// arena / budget (0 without a plan).
    pub fn fill(&self) -> f64 {
        self.arena
            .map_or(0.0, |a| a as f64 / self.budget.max(1) as f64)
    }
}

/// The sweep's answer for one model.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetSweep {
    /// Keep-all's arena (the first budget).
    pub keep_all: u64,
    /// The smallest arena of the fixed policies (the last budget).
    pub minimum: u64,
    /// The budgets, falling.
    pub points: Vec<BudgetPoint>,
}

impl BudgetSweep {
    /// Every budget got a plan within it.
    pub fn all_within(&self) -> bool {
        self.points
            .iter()
            .all(|p| p.arena.is_some_and(|a| a <= p.budget))
    }

    /// As the budget falls, the arena never rises and the recompute never falls.
    pub fn monotone(&self) -> bool {
        self.points.windows(2).all(|w| {
            w[1].arena.unwrap_or(u64::MAX) <= w[0].arena.unwrap_or(u64::MAX)
                && w[1].recompute_flops >= w[0].recompute_flops
        })
    }
}

/// Compiles `source` with `options` under auto checkpointing at `steps` budgets evenly
/// spaced from the keep-all arena down to the smallest arena of keep-all, per-block, every
/// k-th block up to 4, sqrt(n) and min-cut (both included). `None` when the model does not
/// compile without a budget.
pub fn budget_sweep(source: &str, options: &Options, steps: usize) -> Option<BudgetSweep> {
    let arena = |checkpoint, budget| {
        compile(
            source,
            &Options {
                checkpoint,
                budget,
                ..options.clone()
            },
        )
        .ok()
    };
    let keep_all = arena(CheckpointMode::KeepAll, None)?
        .plan
        .plan()
        .arena_bytes;
    let every = |k| CheckpointMode::Every(NonZeroUsize::new(k).unwrap_or(NonZeroUsize::MIN));
    let minimum = [
        every(1),
        every(2),
        every(3),
        every(4),
        CheckpointMode::Sqrt,
        CheckpointMode::MinCut,
    ]
    .into_iter()
    .filter_map(|mode| arena(mode, None).map(|c| c.plan.plan().arena_bytes))
    .fold(keep_all, u64::min);
    let steps = steps.max(2);
    let points = (0..steps)
        .map(|i| {
            let budget = keep_all - (keep_all - minimum) * i as u64 / (steps as u64 - 1);
            let chosen = arena(CheckpointMode::Auto, Some(budget));
            let report = chosen.as_ref().map(|c| &c.plan.plan().report);
            let checkpoint = report.and_then(|r| r.checkpoint.as_ref());
            BudgetPoint {
                budget,
                arena: chosen.as_ref().map(|c| c.plan.plan().arena_bytes),
                recompute_flops: checkpoint.map_or(0, |s| s.recompute_flops),
                recompute_percent: report.map_or(0.0, |r| r.recompute_percent()),
                policy: match (&chosen, checkpoint) {
                    (None, _) => "no plan".into(),
                    (Some(_), None) => "keep all".into(),
                    (Some(_), Some(s)) => s.policy.clone(),
                },
            }
        })
        .collect();
    Some(BudgetSweep {
        keep_all,
        minimum,
        points,
    })
}
