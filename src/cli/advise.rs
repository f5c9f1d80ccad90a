//! `memc advise`: the table of memory-saving options, each row a compiled plan.

use super::{output, CompileArgs, Failure, Format};
use memc::plan::human_bytes;
use std::fmt::Write;

/// Arguments of `memc advise`.
#[derive(clap::Args)]
pub struct AdviseArgs {
    /// The file, `--set` overrides and compile options; `--budget SIZE` is required.
    #[command(flatten)]
    args: CompileArgs,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

/// Prints the options best first.
pub fn advise(a: AdviseArgs) -> Result<(), Failure> {
    let (src, opts, budget) = super::budgeted(&a.args, "advise")?;
    let mut unbudgeted = a.args.clone();
    unbudgeted.budget = None;
    super::compile_file(&unbudgeted)?;
    let rows = memc::advise::advise(
        &src,
        &memc::Options {
            budget: None,
            ..opts
        },
        budget,
    );
    let text = match a.format {
        Format::Json => serde_json::to_string_pretty(&rows)
            .map(|s| s + "\n")
            .map_err(|e| Failure::Internal(vec![e.to_string()]))?,
        Format::Text => {
            let mut out = format!(
                "options for {} within {}, best first (each row a compiled plan):\n",
                a.args.file.display(),
                human_bytes(budget)
            );
            let _ = writeln!(
                out,
                "  {:<36} {:>12} {:>5} {:>9}  note",
                "option", "arena", "fits", "recompute"
            );
            for r in &rows {
                let arena = r.arena_bytes.map_or("-".to_string(), human_bytes);
                let _ = writeln!(
                    out,
                    "  {:<36} {:>12} {:>5} {:>8.2}%  {}",
                    r.option,
                    arena,
                    if r.fits { "yes" } else { "no" },
                    r.extra_compute_percent,
                    r.note
                );
            }
            out
        }
    };
    output::write(None, &text)
}
