//! `memc compile --tile` and `memc check --tile`: the window's plan and how it runs over
//! the whole input.

use super::{options, output, read_source, rendered, CompileArgs, Emit, Failure, Format};
use memc::tiling::{compile_tiled, TileSpec, Tiling};
use memc::{CompileError, Compiled};
use std::path::Path;

/// Compiles the file named in `args` to run over the tiles its `--tile` asks for.
pub(super) fn tiled(args: &CompileArgs) -> Result<(Compiled, Tiling), Failure> {
    let text = args.tile.as_deref().unwrap_or_default();
    let spec: TileSpec = text.parse().map_err(Failure::Plain)?;
    let src = read_source(&args.file)?;
    let opts = options(args)?;
    if spec.side.is_none() && opts.unified == Some(true) {
        return Err(Failure::Plain(format!(
            "--tile {}=auto takes the largest tile whose plan fits --budget, and --unified lets the arena exceed it (the driver pages); give the side, e.g. --tile {}=64",
            spec.dim, spec.dim
        )));
    }
    compile_tiled(&src, &opts, &spec).map_err(|e| match e {
        CompileError::User(u) => Failure::user(u, &args.file.display().to_string(), &src),
        CompileError::Internal(errs) => Failure::Internal(errs),
    })
}

/// `memc compile --tile`: what `memc compile` prints of the window's plan, the text report
/// followed by the tiling's lines.
pub(super) fn compile(
    args: &CompileArgs,
    emit: Emit,
    format: Format,
    summary: bool,
    to: Option<&Path>,
) -> Result<(), Failure> {
    let (compiled, tiling) = tiled(args)?;
    let mut text = rendered(&compiled, emit, format, summary)?;
    if (emit, format, summary) == (Emit::Report, Format::Text, false) {
        for line in tiling.lines() {
            text.push_str(&line);
            text.push('\n');
        }
    }
    output::write(to, &text)
}
