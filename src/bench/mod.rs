//! `memc bench checkpoint`: keep-everything, per-block, sqrt(n) segments, selective and
//! min-cut recomputation, and the budget-driven choice, measured by the same planner on the
//! example models, at budgets that keep 75%, 50% and 25% of the keep-everything
//! saved-activation bytes on top of everything else.

mod compile;

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
            let r = &c.plan.plan().report;
            let pct = r.checkpoint.as_ref().map_or(0.0, |s| {
                100.0 * s.recompute_flops as f64 / r.flops.max(1) as f64
            });
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
        "model", "budget (act kept)", "policy", "arena", "recompute", "compile"
    );
    for name in ["gpt2", "llama7b", "resnet18", "unet"] {
        let path = examples.join(format!("{name}.mdl"));
        if !path.exists() {
            continue;
        }
        let src = std::fs::read_to_string(&path)?;
        let keep = match compile(
            &src,
            &Options {
                checkpoint: CheckpointMode::KeepAll,
                ..Options::default()
            },
        ) {
            Ok(c) => c,
            Err(_) => continue,
        };
        let b = &keep.plan.plan().report.bytes;
        for (label, mode) in [
            ("keep-all", CheckpointMode::KeepAll),
            ("block", CheckpointMode::BLOCK),
            ("sqrt(n)", CheckpointMode::Sqrt),
            ("selective", CheckpointMode::Selective),
            ("min-cut", CheckpointMode::MinCut),
        ] {
            row(&mut out, name, "-", label, measure(&src, mode, None));
        }
        for fraction in [0.75, 0.5, 0.25] {
            let budget = b.arena - (b.activations as f64 * (1.0 - fraction)) as u64;
            let label = format!("{} ({}%)", human_bytes(budget), (fraction * 100.0) as u32);
            row(
                &mut out,
                name,
                &label,
                "auto",
                measure(&src, CheckpointMode::Auto, Some(budget)),
            );
        }
    }
    Ok(out)
}
