//! Loading parameters from safetensors checkpoints as Hugging Face publishes them: one file,
//! or the shards a `model.safetensors.index.json` lists (or a folder holding either), in
//! f32, f16, bf16 or f64, one shard in memory at a time. A tensor is matched to a parameter
//! by its name, or by its name under the model's base prefix (`h.0.ln_1.weight` for
//! `transformer.h.0.ln_1.weight`, as `from_pretrained` does for checkpoints saved from the
//! base model); checkpoint tensors no parameter takes (tied copies, cached masks) are
//! counted, not loaded.

use crate::exec::lowp::from_bytes;
use crate::ir::DType;
use safetensors::{Dtype, SafeTensors};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// A parameter to fill: its name and shape.
pub struct Wanted {
    /// The parameter's name in the model.
    pub name: String,
    /// Its shape; the checkpoint's tensor must have exactly this one.
    pub shape: Vec<usize>,
    /// Whether the parameter keeps its initial values when no tensor holds it (LoRA's
    /// adapters on a base model's checkpoint).
    pub optional: bool,
}

/// What a load did.
#[derive(Debug, Default, PartialEq)]
pub struct Loaded {
    /// The files read, in order.
    pub files: Vec<PathBuf>,
    /// Checkpoint tensors no parameter took, sorted.
    pub unused: Vec<String>,
}

/// Fills every parameter of `wanted` from the checkpoint at `path`, calling `set(index,
/// values)` once per parameter it holds with its values as f32. Fails, naming the tensor, on
/// a shape that differs, a dtype that is not a float, a parameter that is not optional and
/// no file holds, or one two files hold; `set`'s own errors pass through.
pub fn load(
    path: &Path,
    wanted: &[Wanted],
    mut set: impl FnMut(usize, Vec<f32>) -> Result<(), String>,
) -> Result<Loaded, String> {
    let files = files(path)?;
    let exact: HashMap<&str, usize> = wanted
        .iter()
        .enumerate()
        .map(|(i, w)| (w.name.as_str(), i))
        .collect();
    // A name under the base prefix matches only when one parameter has it.
    let mut unprefixed: HashMap<&str, Option<usize>> = HashMap::new();
    for (i, w) in wanted.iter().enumerate() {
        if let Some((_, rest)) = w.name.split_once('.') {
            unprefixed
                .entry(rest)
                .and_modify(|e| *e = None)
                .or_insert(Some(i));
        }
    }
    let mut filled = vec![false; wanted.len()];
    let mut unused = BTreeSet::new();
    for file in &files {
        let bytes =
            std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        let st = SafeTensors::deserialize(&bytes)
            .map_err(|e| format!("{}: not a safetensors file: {e}", file.display()))?;
        for (name, view) in st.tensors() {
            let Some(&i) = exact
                .get(name.as_str())
                .or_else(|| unprefixed.get(name.as_str()).and_then(Option::as_ref))
            else {
                unused.insert(name);
                continue;
            };
            let want = &wanted[i];
            if filled[i] {
                return Err(format!(
                    "{}: `{name}` fills parameter `{}` a second time",
                    file.display(),
                    want.name
                ));
            }
            if view.shape() != want.shape.as_slice() {
                return Err(format!(
                    "{}: `{name}` has shape {:?}; the model expects {:?} for parameter `{}`",
                    file.display(),
                    view.shape(),
                    want.shape,
                    want.name
                ));
            }
            let values = to_f32(view.dtype(), view.data()).ok_or_else(|| {
                format!(
                    "{}: `{name}` is {:?}; memc loads f32, f16, bf16 and f64 tensors",
                    file.display(),
                    view.dtype()
                )
            })?;
            set(i, values)?;
            filled[i] = true;
        }
    }
    let missing: Vec<&str> = wanted
        .iter()
        .zip(&filled)
        .filter(|(w, f)| !**f && !w.optional)
        .map(|(w, _)| w.name.as_str())
        .collect();
    if let Some(first) = missing.first() {
        return Err(format!(
            "{}: no tensor for parameter `{first}` ({} of {} parameters missing)",
            path.display(),
            missing.len(),
            wanted.len()
        ));
    }
    Ok(Loaded {
        files,
        unused: unused.into_iter().collect(),
    })
}

/// The safetensors files `path` names: itself, the shards of an index, or the checkpoint
/// in a folder.
fn files(path: &Path) -> Result<Vec<PathBuf>, String> {
    if path.is_dir() {
        let index = path.join("model.safetensors.index.json");
        if index.is_file() {
            return shards(&index);
        }
        let single = path.join("model.safetensors");
        if single.is_file() {
            return Ok(vec![single]);
        }
        return Err(format!(
            "{}: holds neither model.safetensors nor model.safetensors.index.json",
            path.display()
        ));
    }
    if path.extension().is_some_and(|e| e == "json") {
        return shards(path);
    }
    Ok(vec![path.to_path_buf()])
}

/// The shard files of an index's `weight_map`, beside the index, each once, sorted.
fn shards(index: &Path) -> Result<Vec<PathBuf>, String> {
    let text = std::fs::read_to_string(index)
        .map_err(|e| format!("cannot read {}: {e}", index.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("{}: not valid JSON: {e}", index.display()))?;
    let Some(map) = json.get("weight_map").and_then(|m| m.as_object()) else {
        return Err(format!(
            "{}: no `weight_map` (not a safetensors index)",
            index.display()
        ));
    };
    let dir = index.parent().unwrap_or(Path::new("."));
    let mut names = BTreeSet::new();
    for (tensor, file) in map {
        let Some(file) = file
            .as_str()
            .filter(|f| !f.contains('/') && !f.contains('\\'))
        else {
            return Err(format!(
                "{}: `{tensor}` maps to {file}, not a file name beside the index",
                index.display()
            ));
        };
        names.insert(file.to_string());
    }
    Ok(names.into_iter().map(|n| dir.join(n)).collect())
}

/// Little-endian `data` of `dtype` as f32, `None` for a dtype that is not a float.
fn to_f32(dtype: Dtype, data: &[u8]) -> Option<Vec<f32>> {
    Some(match dtype {
        Dtype::F32 => from_bytes(DType::F32, data),
        Dtype::F16 => from_bytes(DType::F16, data),
        Dtype::BF16 => from_bytes(DType::BF16, data),
        Dtype::F64 => data
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f32)
            .collect(),
        _ => return None,
    })
}
