//! `memc viz`: writes the arena-over-time page of a compiled plan (atomically).

use super::{output, CompileArgs, Failure};
use std::path::PathBuf;

/// Arguments of `memc viz`.
#[derive(clap::Args)]
pub struct VizArgs {
    /// The file, `--set` overrides and compile options.
    #[command(flatten)]
    args: CompileArgs,
    /// The HTML file to write, e.g. memory.html.
    #[arg(short, long)]
    output: PathBuf,
}

/// Compiles the file and writes [`memc::viz::render_html`] of its plan to `--output`, the
/// `.mdl` lines named by the file's name.
pub fn viz(a: VizArgs) -> Result<(), Failure> {
    let compiled = super::compile_file(&a.args)?;
    let plan = compiled.plan.plan();
    let file = a.args.file.file_name().map_or_else(
        || a.args.file.display().to_string(),
        |f| f.to_string_lossy().into_owned(),
    );
    output::write_atomic(&a.output, memc::viz::render_html(plan, &file).as_bytes())?;
    eprintln!(
        "wrote {} ({} buffers over {} steps, arena {})",
        a.output.display(),
        plan.buffers.len(),
        plan.steps.len(),
        memc::plan::human_bytes(plan.arena_bytes)
    );
    Ok(())
}
