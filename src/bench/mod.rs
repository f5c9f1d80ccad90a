//! `memc bench checkpoint`: keep-everything, per-block, sqrt(n) segments, selective and
//! min-cut recomputation, and the budget-driven choice, measured by the same planner on the
//! example models, at twelve budgets from the keep-everything arena down to the smallest
//! plan a fixed policy reaches (`budgets.rs`).

mod budgets;
mod compile;

pub use budgets::{budget_sweep, BudgetPoint, BudgetSweep};
pub use compile::compile_table;

use crate::budget::CheckpointMode;
use crate::plan::human_bytes;
use crate::{compile, CompileError, Options};
use std::fmt::Write;
use std::path::Path;
use std::time::Instant;

fn row(
    out: &mut String,
    model: &str,
    budget: &str,
    mode: &str,
    result: Result<(u64, f64, f64), String>,
) {
    match result {
        Ok((arena, pct, secs)) => {
            let _ = writeln!(
                out,
                "{model:<10} {budget:>18} {mode:<10} {:>12} {:>9.2}% {:>8.2}s",
                human_bytes(arena),
                pct,
                secs
            );
        }
        Err(e) => {
            let _ = writeln!(out, "{model:<10} {budget:>18} {mode:<10} {e}");
        }
    }
}

fn measure(
    src: &str,
    mode: CheckpointMode,
    budget: Option<u64>,
) -> Result<(u64, f64, f64), String> {
    let start = Instant::now();
    let options = Options {
        checkpoint: mode,
        budget,
        ..Options::default()
    };
    match compile(src, &options) {
        Ok(c) => {
            let pct = c.plan.plan().report.recompute_percent();
            Ok((
                c.plan.plan().arena_bytes,
                pct,
                start.elapsed().as_secs_f64(),
            ))
        }
        Err(CompileError::User(e)) => Err(format!("does not fit: {}", e.message)),
        Err(CompileError::Internal(e)) => Err(format!("internal error: {}", e.join("; "))),
    }
}

/// The comparison table for the models in `examples` (gpt2, llama7b, resnet18, unet when
/// present).
pub fn checkpoint_table(examples: &Path) -> Result<String, std::io::Error> {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<10} {:>18} {:<10} {:>12} {:>10} {:>9}",
        "model", "budget", "policy", "arena", "recompute", "compile"
    );
    for name in ["gpt2", "llama7b", "resnet18", "unet"] {
        let path = examples.join(format!("{name}.mdl"));
        if !path.exists() {
            continue;
        }
        let src = std::fs::read_to_string(&path)?;
        for (label, mode) in [
            ("keep-all", CheckpointMode::KeepAll),
            ("block", CheckpointMode::BLOCK),
            ("sqrt(n)", CheckpointMode::Sqrt),
            ("selective", CheckpointMode::Selective),
            ("min-cut", CheckpointMode::MinCut),
        ] {
            row(&mut out, name, "-", label, measure(&src, mode, None));
        }
        if let Some(sweep) = budget_sweep(&src, &Options::default(), 12) {
            sweep_rows(&mut out, name, &sweep);
        }
    }
    Ok(out)
}

/// Auto mode's rows over the budget sweep, then whether they stay within budget and are
/// monotone, and their mean fill.
fn sweep_rows(out: &mut String, model: &str, sweep: &BudgetSweep) {
    for p in &sweep.points {
        let budget = human_bytes(p.budget);
        match p.arena {
            Some(arena) => {
                let _ = writeln!(
                    out,
                    "{model:<10} {budget:>18} {:<10} {:>12} {:>9.2}% fill {:.3}  {}",
                    "auto",
                    human_bytes(arena),
                    p.recompute_percent,
                    p.fill(),
                    p.policy
                );
            }
            None => {
                let _ = writeln!(out, "{model:<10} {budget:>18} auto       no plan");
            }
        }
    }
    let fills: Vec<f64> = sweep.points.iter().map(BudgetPoint::fill).collect();
    let _ = writeln!(
        out,
        "{model:<10} {} budgets from {} to {}: all within budget: {}; monotone: {}; mean fill {:.3}, lowest {:.3}",
        sweep.points.len(),
        human_bytes(sweep.keep_all),
        human_bytes(sweep.minimum),
        if sweep.all_within() { "yes" } else { "no" },
        if sweep.monotone() { "yes" } else { "no" },
        fills.iter().sum::<f64>() / fills.len().max(1) as f64,
        fills.iter().copied().fold(f64::INFINITY, f64::min),
    );
}
