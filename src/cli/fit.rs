//! `memc fit`: the largest value of a dim whose plan fits a budget, with a progress spinner
//! on a terminal.

use super::{output, CompileArgs, Failure, Format};
use memc::fit::{fit_accumulation, fit_dim_with, AccumulationFit, FitError, FitResult, Probe};
use memc::plan::human_bytes;
use memc::CompileError;

/// Arguments of `memc fit`.
#[derive(clap::Args)]
pub struct FitArgs {
    /// The file, `--set` overrides and compile options; `--budget SIZE` is required.
    #[command(flatten)]
    args: CompileArgs,
    /// The dim to maximize.
    #[arg(long, default_value = "B")]
    dim: String,
    /// Search only multiples of N (a dim that must stay aligned or divide another).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(i64).range(1..))]
    multiple_of: i64,
    /// Instead of a dim: the fewest data-parallel ranks (1, 2, 4, ... up to MAX, default
    /// 1024) and, at that count, the lowest ZeRO stage whose per-rank plan fits --budget on
    /// each device.
    #[arg(long, value_name = "MAX", num_args = 0..=1, default_missing_value = "1024", value_parser = clap::value_parser!(u32).range(1..=65_536))]
    ranks: Option<u32>,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

/// Runs the search and prints the answer (text: the dim, value, arena at value and value+1,
/// then the plan's report; JSON: `{"dim", "value", "arena_bytes", "next_arena_bytes", ...}`).
pub fn fit(a: FitArgs) -> Result<(), Failure> {
    let (src, opts, budget) = super::budgeted(&a.args, "fit")?;
    if let Some(max) = a.ranks {
        return super::fit_ranks::fit(&src, &opts, (budget, max), a.format);
    }
    let bar = output::spinner("{spinner} fit: {pos} compiles, {msg} [{elapsed}]");
    let mut on_probe = |p: &Probe| {
        if let Some(bar) = &bar {
            bar.inc(1);
            bar.set_message(if p.refused {
                format!("{}={} does not compile", a.dim, p.value)
            } else {
                format!(
                    "{}={} needs {} ({})",
                    a.dim,
                    p.value,
                    human_bytes(p.arena_bytes),
                    if p.fits { "fits" } else { "too big" }
                )
            });
        }
    };
    let json_format = a.format == Format::Json;
    if opts.unified == Some(true) {
        return Err(Failure::Plain(
            "memc fit searches plans within the budget, and --unified lets the arena exceed it (the driver pages); compare it with `memc advise --device cuda` instead".into(),
        ));
    }
    if a.args.accumulate_search() && a.multiple_of > 1 {
        return Err(Failure::Plain(
            "--multiple-of applies to the search over a dim, not to --accumulate (whose micro-batches divide the batch)".into(),
        ));
    }
    let result = if a.args.accumulate_search() {
        fit_accumulation(&src, &opts, &a.dim, budget, &mut on_probe).map(|r| {
            if json_format {
                accumulation_json(&r)
            } else {
                Ok(accumulation_text(&r))
            }
        })
    } else {
        fit_dim_with(&src, &opts, (&a.dim, a.multiple_of), budget, &mut on_probe).map(|r| {
            let bf16 = in_bf16(&r, &a, (&src, &opts, budget), &mut on_probe);
            if json_format {
                json(&r, bf16.as_ref())
            } else {
                Ok(text(&r, bf16.as_ref()))
            }
        })
    };
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let text = result.map_err(|e| failure(e, &a, &src))??;
    output::write(None, &text)
}

fn failure(e: FitError, a: &FitArgs, src: &str) -> Failure {
    let name = a.args.file.display().to_string();
    match e {
        FitError::Compile {
            value,
            error: CompileError::User(u),
        } => {
            if value > 0 {
                eprintln!("memc fit: the model does not compile at {}={value}:", a.dim);
            }
            Failure::user(u, &name, src)
        }
        FitError::Compile {
            value,
            error: CompileError::Internal(errs),
        } => Failure::Internal(
            errs.into_iter()
                .map(|e| format!("at {}={value}: {e}", a.dim))
                .collect(),
        ),
        FitError::Infeasible {
            ref bytes, value, ..
        } => {
            let parts: Vec<String> = bytes
                .parts()
                .iter()
                .filter(|(_, v)| *v > 0)
                .map(|(n, v)| format!("{n} {}", human_bytes(*v)))
                .collect();
            Failure::Plain(format!("{e}\n  at {value}: {}", parts.join(", ")))
        }
        other => Failure::Plain(other.to_string()),
    }
}

/// For a training step in fp32 whose precision no flag set: the same search in bf16 mixed
/// precision (fp32 master weights and optimizer state), the knob `memc fit` tries beside
/// checkpointing and the loss head's chunks, reported beside the answer rather than taken,
/// since it changes the step's numerics. `None` when it does not apply or finds nothing.
fn in_bf16(
    r: &FitResult,
    a: &FitArgs,
    (src, opts, budget): (&str, &memc::Options, u64),
    on_probe: &mut dyn FnMut(&Probe),
) -> Option<FitResult> {
    let train = r.plan.plan().train.as_ref()?;
    if opts.precision.is_some() || train.precision != memc::settings::Precision::Fp32 {
        return None;
    }
    // The search starts from the fp32 answer, near where the bf16 one lies.
    let mut bf16 = memc::Options {
        precision: Some(memc::settings::Precision::Bf16),
        ..opts.clone()
    };
    bf16.overrides.retain(|(name, _)| *name != a.dim);
    bf16.overrides.push((a.dim.clone(), r.value));
    fit_dim_with(src, &bf16, (&a.dim, a.multiple_of), budget, on_probe).ok()
}

fn text(r: &FitResult, bf16: Option<&FitResult>) -> String {
    let next = match &r.next_refusal {
        Some(why) => format!(
            "does not compile ({why}), so the answer is the largest value found below it that compiles and fits"
        ),
        None => format!(
            "arena {} ({} bytes), does not fit{}",
            human_bytes(r.next_arena_bytes),
            r.next_arena_bytes,
            if r.next_without_budget {
                " (no plan within the budget; this is the plan compiled without one)"
            } else {
                ""
            }
        ),
    };
    let refused = r.probes.iter().filter(|p| p.refused).count();
    let mut out = format!(
        "fit {dim}: largest {dim} within {} ({} bytes) is {}\n  {dim}={}: arena {} ({} bytes), fits\n  {dim}={}: {next}\n  {} compiles (searched from {dim}={}){}\n",
        human_bytes(r.budget),
        r.budget,
        r.value,
        r.value,
        human_bytes(r.arena_bytes),
        r.arena_bytes,
        r.next_value,
        r.probes.len(),
        r.start,
        if refused > 0 {
            format!("; {refused} value(s) did not compile and count as not fitting")
        } else {
            String::new()
        },
        dim = r.dim,
    );
    if let Some(b) = bf16 {
        out.push_str(&format!(
            "  with --precision bf16 (fp32 master weights and optimizer state): {dim}={}, arena {} ({} bytes)\n",
            b.value,
            human_bytes(b.arena_bytes),
            b.arena_bytes,
            dim = b.dim,
        ));
    }
    let plan = r.plan.plan();
    if let Some(o) = (plan.train.as_ref().and_then(|t| t.offload)).filter(|o| o.any()) {
        out.push_str(&format!(
            "  with --offload {}: nothing fits with everything on the device; of the offload settings this one reaches the largest value ({} in host memory)\n",
            o.word(),
            o.what()
        ));
    }
    out.push('\n');
    out.push_str(&memc::plan::render_text(plan));
    out
}

fn accumulation_text(r: &AccumulationFit) -> String {
    let how = if r.accumulate == 1 {
        "without accumulation".to_string()
    } else {
        format!(
            "as {} micro-batches of {}={}",
            r.accumulate, r.dim, r.micro_batch
        )
    };
    let mut out = format!(
        "fit {dim} with gradient accumulation: {dim}={} within {} ({} bytes) {how}\n  {dim}={} x {}: arena {} ({} bytes), fits\n",
        r.batch,
        human_bytes(r.budget),
        r.budget,
        r.micro_batch,
        r.accumulate,
        human_bytes(r.arena_bytes),
        r.arena_bytes,
        dim = r.dim,
    );
    if let Some(n) = &r.next {
        out.push_str(&format!(
            "  {dim}={} x {}: arena {} ({} bytes), does not fit\n",
            n.value,
            r.batch / n.value,
            human_bytes(n.arena_bytes),
            n.arena_bytes,
            dim = r.dim,
        ));
    }
    out.push_str(&format!("  {} compiles\n\n", r.probes.len()));
    out.push_str(&memc::plan::render_text(r.plan.plan()));
    out
}

fn accumulation_json(r: &AccumulationFit) -> Result<String, Failure> {
    to_json(serde_json::json!({
        "dim": r.dim,
        "batch": r.batch,
        "micro_batch": r.micro_batch,
        "accumulate": r.accumulate,
        "arena_bytes": r.arena_bytes,
        "next_micro_batch": r.next.map(|p| p.value),
        "next_arena_bytes": r.next.map(|p| p.arena_bytes),
        "budget": r.budget,
        "compiles": r.probes.len(),
        "report": r.plan.plan().report,
    }))
}

pub(super) fn to_json(v: serde_json::Value) -> Result<String, Failure> {
    serde_json::to_string_pretty(&v)
        .map(|s| s + "\n")
        .map_err(|e| Failure::Internal(vec![format!("cannot serialize: {e}")]))
}

fn json(r: &FitResult, bf16: Option<&FitResult>) -> Result<String, Failure> {
    let v = serde_json::json!({
        "with_bf16": bf16.map(|b| serde_json::json!({
            "flags": ["--precision", "bf16"],
            "value": b.value,
            "arena_bytes": b.arena_bytes,
        })),
        "dim": r.dim,
        "value": r.value,
        "arena_bytes": r.arena_bytes,
        "next_value": r.next_value,
        "next_arena_bytes": r.next_arena_bytes,
        "next_without_budget": r.next_without_budget,
        "next_refusal": r.next_refusal,
        "budget": r.budget,
        "compiles": r.probes.len(),
        "report": r.plan.plan().report,
    });
    to_json(v)
}
