//! ONNX import never panics: the test corpus's files with bytes flipped, dropped and
//! truncated, and its graphs with nodes, attributes and inputs mutated, are each imported
//! and compiled; each must give a model or a diagnostic, never a panic or an internal error.
#![allow(clippy::panic, clippy::unwrap_used)]

use std::path::Path;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Small xorshift64 generator: the same mutants on every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n.max(1) as u64) as usize
    }
}

/// Imports `bytes` and compiles the result: `None` when the import refuses them, else
/// whether the model compiled. Panics (naming `what`) on a panic or an internal error.
fn import_and_compile(bytes: &[u8], what: impl Fn() -> String) -> Option<bool> {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    let result = catch_unwind(AssertUnwindSafe(|| memc::onnx::import(bytes, "fuzz")));
    let Ok(result) = result else {
        panic!("import panicked on {}", what());
    };
    let model = result.ok()?;
    let compiled = catch_unwind(AssertUnwindSafe(|| {
        memc::compile(&model.mdl, &memc::Options::default())
    }));
    match compiled {
        Err(_) => panic!("compile panicked on:\n{}", model.mdl),
        Ok(Err(memc::CompileError::Internal(e))) => {
            panic!("internal error {e:?} on:\n{}", model.mdl)
        }
        Ok(result) => Some(result.is_ok()),
    }
}

/// Flipped, overwritten, deleted and truncated bytes of the test models never panic the
/// importer, and what it writes compiles or gets a user error (never an internal error).
#[test]
fn mutated_files_never_panic() {
    let mut files = vec![
        Path::new(ROOT).join("tests/onnx/dynamic_batch.onnx"),
        Path::new(ROOT).join("tests/onnx/attention_mix.onnx"),
        Path::new(ROOT).join("tests/onnx/resize.onnx"),
    ];
    files.extend(
        std::fs::read_dir(Path::new(ROOT).join("tests/onnx/errors"))
            .expect("corpus")
            .filter_map(Result::ok)
            .map(|e| e.path()),
    );
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let (mut imported, mut total) = (0, 0);
    for file in &files {
        let original = std::fs::read(file).expect("model");
        for _ in 0..500 {
            let mut bytes = original.clone();
            for _ in 0..1 + rng.below(3) {
                let at = rng.below(bytes.len());
                match rng.below(4) {
                    0 => bytes[at] ^= 1 << rng.below(8),
                    1 => bytes[at] = rng.below(256) as u8,
                    2 => {
                        bytes.remove(at);
                    }
                    _ => bytes.truncate(at.max(1)),
                }
                if bytes.is_empty() {
                    break;
                }
            }
            total += 1;
            if import_and_compile(&bytes, || file.display().to_string()).is_some() {
                imported += 1;
            }
        }
    }
    eprintln!("{imported} of {total} mutants imported");
}

/// Structural mutants of the small test models (attribute values, tensor dims, op types,
/// dropped or rewired inputs) never panic the importer or make it write a model that fails compiling
/// with an internal error.
#[test]
fn mutated_graphs_never_panic() {
    use memc::onnx::proto::ModelProto;
    use prost::Message;
    const OPS: &[&str] = &[
        "Conv",
        "Relu",
        "MaxPool",
        "AveragePool",
        "Shape",
        "Gather",
        "Unsqueeze",
        "Concat",
        "Reshape",
        "Gemm",
        "Softmax",
        "Flatten",
        "Transpose",
        "Sum",
        "LRN",
        "BatchNormalization",
        "GlobalAveragePool",
        "Squeeze",
        "MatMul",
        "Slice",
        "ReduceMean",
        "Split",
        "Pow",
        "Erf",
        "LayerNormalization",
        "Div",
        "Resize",
        "Pad",
    ];
    let originals: Vec<ModelProto> = ["dynamic_batch", "attention_mix", "resize"]
        .iter()
        .map(|name| {
            let path = Path::new(ROOT).join(format!("tests/onnx/{name}.onnx"));
            let bytes = std::fs::read(path).expect("model");
            ModelProto::decode(&bytes[..]).expect("decode")
        })
        .collect();
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let (mut imported, mut compiled_ok, total) = (0, 0, 4000);
    for i in 0..total {
        let mut m = originals[i % originals.len()].clone();
        let g = m.graph.as_mut().expect("graph");
        for _ in 0..1 + rng.below(2) {
            let n = rng.below(g.node.len());
            let node = &mut g.node[n];
            match rng.below(5) {
                0 if !node.attribute.is_empty() => {
                    let a = rng.below(node.attribute.len());
                    let attr = &mut node.attribute[a];
                    attr.i = rng.below(12) as i64 - 3;
                    if !attr.ints.is_empty() {
                        let k = rng.below(attr.ints.len());
                        attr.ints[k] = rng.below(12) as i64 - 3;
                    }
                }
                1 => node.op_type = OPS[rng.below(OPS.len())].to_string(),
                2 if !node.input.is_empty() => {
                    let k = rng.below(node.input.len());
                    node.input.remove(k);
                }
                3 => {
                    let t = rng.below(g.initializer.len());
                    let init = &mut g.initializer[t];
                    if !init.dims.is_empty() {
                        let k = rng.below(init.dims.len());
                        init.dims[k] = rng.below(6) as i64;
                    }
                }
                _ => {
                    let k = rng.below(g.node.len());
                    let from = g.node[k].output[0].clone();
                    let node = &mut g.node[n];
                    if !node.input.is_empty() {
                        let i = rng.below(node.input.len());
                        node.input[i] = from;
                    }
                }
            }
        }
        match import_and_compile(&m.encode_to_vec(), || format!("{m:#?}")) {
            Some(true) => (imported, compiled_ok) = (imported + 1, compiled_ok + 1),
            Some(false) => imported += 1,
            None => {}
        }
    }
    eprintln!("{imported} of {total} graph mutants imported, {compiled_ok} compiled");
}
