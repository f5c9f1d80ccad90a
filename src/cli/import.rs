//! `memc import`: an ONNX model to a readable `.mdl` plus its weights as safetensors, or a
//! Hugging Face `config.json` to a `.mdl` whose parameters its checkpoints fill.

use super::{output::write_atomic, Failure};
use memc::exec::io::write_safetensors;
use std::path::PathBuf;

/// Arguments of `memc import`.
#[derive(clap::Args)]
pub struct ImportArgs {
    /// The .onnx file, or a Hugging Face transformers config.json (or the model's folder
    /// holding it).
    file: PathBuf,
    /// The .mdl to write.
    #[arg(short, long)]
    output: PathBuf,
    /// Where an ONNX model's weights go (default: the output path with extension
    /// .safetensors); a config.json has none: its checkpoint loads with `memc run --params`.
    #[arg(long)]
    weights: Option<PathBuf>,
}

/// Runs the command: both files are written atomically, the weights first.
pub fn import(mut args: ImportArgs) -> Result<(), Failure> {
    if args.file.is_dir() {
        args.file = args.file.join("config.json");
    }
    let bytes = std::fs::read(&args.file)
        .map_err(|e| Failure::Plain(format!("cannot read {}: {e}", args.file.display())))?;
    if args.file.extension().is_some_and(|e| e == "json") {
        return import_config(&args, &bytes);
    }
    let name = args
        .file
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("model");
    let imported = memc::onnx::import(&bytes, name)
        .map_err(|e| Failure::user(e, &args.file.display().to_string(), ""))?;
    let weights = args
        .weights
        .clone()
        .unwrap_or_else(|| args.output.with_extension("safetensors"));
    let data = write_safetensors(&imported.weights, None)
        .map_err(|e| Failure::Plain(format!("cannot encode the weights: {e}")))?;
    write_atomic(&weights, &data)?;
    write_atomic(&args.output, imported.mdl.as_bytes())?;
    let count: usize = imported.weights.iter().map(|(_, _, d)| d.len()).sum();
    eprintln!(
        "wrote {} and {} ({count} parameters); outputs: {}",
        args.output.display(),
        weights.display(),
        imported
            .outputs
            .iter()
            .map(|(onnx, mdl)| {
                let bool_note = if imported.boolean_outputs.contains(mdl) {
                    " (bool as 1/0)"
                } else {
                    ""
                };
                format!("{onnx} -> output.{mdl}.npy{bool_note}")
            })
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

/// A Hugging Face config to `.mdl`, written atomically.
fn import_config(args: &ImportArgs, bytes: &[u8]) -> Result<(), Failure> {
    let name = args.file.display().to_string();
    let text = String::from_utf8_lossy(bytes);
    if args.weights.is_some() {
        return Err(Failure::Plain(
            "--weights is for ONNX models; a config's checkpoint loads with `memc run --params`"
                .into(),
        ));
    }
    let written = memc::hf::import_config(&text).map_err(|e| Failure::user(e, &name, &text))?;
    write_atomic(&args.output, written.mdl.as_bytes())?;
    let folder = args.file.parent().filter(|d| !d.as_os_str().is_empty());
    eprintln!(
        "wrote {} ({}); load its checkpoint with `memc run {} --params {}`",
        args.output.display(),
        written.class,
        args.output.display(),
        folder.map_or("model.safetensors".into(), |d| d.display().to_string())
    );
    Ok(())
}
