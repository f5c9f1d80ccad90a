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
    let gpu = opts.gpu.unwrap_or_default();
    let bar = output::spinner("{spinner} advise: compiling each option [{elapsed}]");
    let rows = memc::advise::advise(
        &src,
        &memc::Options {
            budget: None,
            ..opts
        },
        budget,
    );
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let text = match a.format {
        Format::Json => serde_json::to_string_pretty(&rows)
            .map(|s| s + "\n")
            .map_err(|e| Failure::Internal(vec![e.to_string()]))?,
        Format::Text => {
            let mut out = format!(
                "options for {} within {}, best first (each row a compiled plan; step times are estimates on {}, not measurements; * the frontier of bytes against time; the flags select the row):\n",
                a.args.file.display(),
                human_bytes(budget),
                gpu.spec().name
            );
            // The option column is as wide as its longest entry (marker included), at least 48.
            let width = rows
                .iter()
                .map(|r| r.option.chars().count() + 2)
                .fold(48, usize::max);
            let _ = writeln!(
                out,
                "  {:<width$} {:>12} {:>5} {:>9} {:>12}  note; flags",
                "option",
                "arena",
                "fits",
                "recompute",
                format!("est. {}", gpu.name())
            );
            for r in &rows {
                let arena = r.arena_bytes.map_or("-".to_string(), human_bytes);
                let time = r.step_seconds.map_or("-".to_string(), memc::cost::ms);
                let option = format!("{}{}", if r.frontier { "* " } else { "  " }, r.option);
                let _ = writeln!(
                    out,
                    "  {option:<width$} {:>12} {:>5} {:>8.2}% {:>12}  {}; {}",
                    arena,
                    if r.fits { "yes" } else { "no" },
                    r.extra_compute_percent,
                    time,
                    r.note,
                    r.flags.join(" ")
                );
            }
            out
        }
    };
    output::write(None, &text)
}
