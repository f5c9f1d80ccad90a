//! ONNX import: the nine light models of the `onnx` wheel are imported, compiled and run on
//! the CPU backend, and their outputs compared with onnxruntime on the same inputs (with
//! seeded random weights, and with the shipped weights against the shipped reference
//! output where that output does not depend on the input); a corpus of broken files must
//! each get a diagnostic (exit 2). onnx and onnxruntime come from `.venv` (`scripts/test`
//! installs them); without them the comparison prints SKIP, unless
//! MEMC_REQUIRE_ONNXRUNTIME=1 makes it fail.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use common::{memc, scratch};
use memc::exec::io::{read_npy, TensorData};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Element-wise tolerance: |memc - onnxruntime| <= RTOL * (|onnxruntime| + 1e-6 max|onnxruntime|).
const RTOL: f64 = 1e-3;

const LIGHT: &[&str] = &[
    "light_bvlc_alexnet",
    "light_densenet121",
    "light_inception_v1",
    "light_inception_v2",
    "light_resnet50",
    "light_shufflenet",
    "light_squeezenet",
    "light_vgg19",
    "light_zfnet512",
];

/// Models cheap enough to also run with their shipped (constant) weights.
const SHIPPED: &[&str] = &[
    "light_inception_v1",
    "light_inception_v2",
    "light_resnet50",
    "light_shufflenet",
    "light_squeezenet",
];

fn ok(out: Output, what: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{what} failed:\n{stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap_or_default()
}

/// The venv python with onnx and onnxruntime, or `None` after printing why (SKIP).
fn python() -> Option<PathBuf> {
    let py = Path::new(ROOT).join(".venv/bin/python");
    let usable = Command::new(&py)
        .args(["-c", "import onnx, onnxruntime"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if usable {
        return Some(py);
    }
    let why = format!("{} cannot import onnx and onnxruntime", py.display());
    if std::env::var("MEMC_REQUIRE_ONNXRUNTIME").as_deref() == Ok("1") {
        panic!("{why} (MEMC_REQUIRE_ONNXRUNTIME=1); run scripts/test to install them");
    }
    eprintln!("SKIP: {why}; run scripts/test to install them");
    None
}

fn light_dir(py: &Path) -> PathBuf {
    let out = Command::new(py)
        .args([
            "-c",
            "import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), 'backend', 'test', 'data', 'light'))",
        ])
        .output()
        .expect("python");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn floats(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    match read_npy(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display())) {
        TensorData::F32(shape, data) => (shape, data),
        TensorData::I32(..) => panic!("{}: expected f32", path.display()),
    }
}

/// The largest element-wise error relative to the tolerance's scale.
fn max_rel_error(got: &[f32], want: &[f32]) -> f64 {
    let scale = want.iter().fold(0f64, |m, &v| m.max(f64::from(v).abs()));
    got.iter()
        .zip(want)
        .map(|(&g, &w)| {
            let w = f64::from(w);
            (f64::from(g) - w).abs() / (w.abs() + 1e-6 * scale)
        })
        .fold(0.0, f64::max)
}

/// `.mdl` names declared by lines starting with `keyword ` (inputs or outputs), in order.
fn declared(mdl: &str, keyword: &str) -> Vec<String> {
    mdl.lines()
        .filter_map(|l| l.trim().strip_prefix(keyword))
        .filter_map(|rest| rest.split([':', ' ']).next().map(str::to_string))
        .collect()
}

/// Runs `model` through onnxruntime (reference.py) and memc on the same inputs; returns the
/// largest relative error over all outputs, and onnxruntime's outputs' paths.
fn compare(py: &Path, model: &Path, dir: &Path, random: bool) -> (f64, Vec<PathBuf>) {
    let mut args = vec![
        format!("{ROOT}/tests/onnx/reference.py"),
        s(model).to_string(),
        s(dir).to_string(),
    ];
    if random {
        args.push("--random-weights".into());
    }
    let out = Command::new(py).args(&args).output().expect("python");
    assert!(
        out.status.success(),
        "reference.py {}:\n{}",
        model.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let mdl = dir.join("m.mdl");
    ok(
        memc(&["import", s(&dir.join("model.onnx")), "-o", s(&mdl)]),
        "memc import",
    );
    let text = std::fs::read_to_string(&mdl).expect("mdl");
    let mut run = vec![
        "run".to_string(),
        s(&mdl).to_string(),
        "--params".into(),
        s(&dir.join("m.safetensors")).to_string(),
        "--dump".into(),
        s(&dir.join("out")).to_string(),
    ];
    for (i, name) in declared(&text, "input ").iter().enumerate() {
        run.push("--input".into());
        run.push(format!(
            "{name}={}",
            dir.join(format!("input.{i}.npy")).display()
        ));
    }
    let run: Vec<&str> = run.iter().map(String::as_str).collect();
    ok(memc(&run), "memc run");
    let mut worst = 0.0f64;
    let mut refs = Vec::new();
    for (i, name) in declared(&text, "output ").iter().enumerate() {
        let (gs, got) = floats(&dir.join(format!("out/output.{name}.npy")));
        let reference = dir.join(format!("ref.{i}.npy"));
        let (ws, want) = floats(&reference);
        assert_eq!(gs, ws, "{}: output {name} shape", model.display());
        worst = worst.max(max_rel_error(&got, &want));
        refs.push(reference);
    }
    (worst, refs)
}

#[test]
fn light_models_match_onnxruntime() {
    let Some(py) = python() else { return };
    let light = light_dir(&py);
    let mut failures = Vec::new();
    let mut cases: Vec<(String, PathBuf, bool)> = LIGHT
        .iter()
        .map(|m| (m.to_string(), light.join(format!("{m}.onnx")), true))
        .collect();
    cases.extend(SHIPPED.iter().map(|m| {
        (
            format!("{m} (shipped weights)"),
            light.join(format!("{m}.onnx")),
            false,
        )
    }));
    for small in [
        "dynamic_batch",
        "attention_mix",
        "resize",
        "softplus",
        "flatten_negative",
        "reduce_family",
        "conv_volume",
        "conv_line",
        "instance_norm",
        "einsum",
    ] {
        let path = Path::new(ROOT).join(format!("tests/onnx/{small}.onnx"));
        cases.push((small.into(), path, false));
    }
    for (name, model, random) in &cases {
        let start = Instant::now();
        let dir = scratch(&name.replace([' ', '(', ')'], "_"));
        let (err, refs) = compare(&py, model, &dir, *random);
        let mut line = format!("{name}: max rel error vs onnxruntime {err:.2e}");
        if !random {
            // The shipped reference was computed on an input that is not shipped: it applies
            // when onnxruntime reproduces it on ours (a uniform softmax of constant weights).
            let pb = model.with_file_name(format!(
                "{}_output_0.pb",
                model
                    .file_stem()
                    .and_then(|f| f.to_str())
                    .unwrap_or_default()
            ));
            if pb.exists() {
                let shipped = dir.join("shipped.npy");
                let status = Command::new(&py)
                    .args([
                        "-c",
                        "import sys, onnx, numpy; from onnx import numpy_helper; t = onnx.TensorProto(); t.ParseFromString(open(sys.argv[1], 'rb').read()); numpy.save(sys.argv[2], numpy_helper.to_array(t).astype(numpy.float32))",
                        s(&pb),
                        s(&shipped),
                    ])
                    .status()
                    .expect("python");
                assert!(status.success(), "cannot read {}", pb.display());
                let (_, want) = floats(&shipped);
                let (_, ort) = floats(&refs[0]);
                if max_rel_error(&ort, &want) < 1e-5 {
                    let (_, got) = floats(
                        &dir.join("out").join(
                            std::fs::read_dir(dir.join("out"))
                                .expect("out")
                                .filter_map(Result::ok)
                                .map(|e| e.file_name())
                                .next()
                                .expect("an output"),
                        ),
                    );
                    let e = max_rel_error(&got, &want);
                    line += &format!(", vs shipped output {e:.2e}");
                    if e >= RTOL {
                        failures.push(format!("{name}: shipped reference error {e:.2e}"));
                    }
                }
            }
        }
        if name == "light_resnet50" {
            // Its identical bottleneck blocks become `block`s repeated per stage.
            let text = std::fs::read_to_string(dir.join("m.mdl")).expect("mdl");
            for count in [2, 3, 5] {
                assert!(text.contains(&format!("= repeat {count} unit")), "{text}");
            }
        }
        eprintln!("{line} ({:.1} s)", start.elapsed().as_secs_f64());
        if err >= RTOL {
            failures.push(line);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// An exporter's attention pattern over static shapes (shape arithmetic folded into a
/// Reshape target, a causal mask folded from Range and Less, Where on it and on a run-time
/// comparison, Clip with input bounds, Slice, variadic Max/Min, Reciprocal, Expand,
/// CastLike, a mask cast to float) matches onnxruntime on every output.
/// `tests/onnx/<name>.onnx` run by memc and onnxruntime: all `outputs` compared, within
/// RTOL, and the imported `.mdl` holds each of `calls`.
fn matches_onnxruntime(name: &str, outputs: usize, calls: &[&str]) {
    let Some(py) = python() else { return };
    let dir = scratch(name);
    let model = Path::new(ROOT).join(format!("tests/onnx/{name}.onnx"));
    let (err, refs) = compare(&py, &model, &dir, false);
    assert_eq!(refs.len(), outputs, "every output compared");
    assert!(err < RTOL, "max rel error vs onnxruntime {err:.2e}");
    let text = std::fs::read_to_string(dir.join("m.mdl")).expect("mdl");
    for call in calls {
        assert!(text.contains(call), "no `{call}` in\n{text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn selections_and_static_shape_arithmetic_match_onnxruntime() {
    matches_onnxruntime(
        "select_shapes",
        4,
        &[
            "where(",
            "clamp(",
            "maximum(",
            "minimum(",
            "reciprocal(",
            "expand(",
            "slice(",
        ],
    );
}

/// Resize (linear and nearest by fractional scales, cubic to sizes with align_corners,
/// antialiased cubic shrinking) as interpolation matrices, Pow with a computed exponent and
/// ConvTranspose of a computed weight to an `output_shape` agree with onnxruntime.
#[test]
fn interpolation_powers_and_transposed_convolutions_match_onnxruntime() {
    matches_onnxruntime(
        "interpolate",
        6,
        &[
            "pow(base, x)",
            "conv_transpose2d(x, w,",
            "] frozen",
            "@ transpose(",
        ],
    );
}

/// `tests/onnx/dynamic_batch.onnx` imported into a fresh scratch dir `name`: the dir and
/// the `.mdl` path.
fn import_dynamic_batch(name: &str) -> (PathBuf, PathBuf) {
    let dir = scratch(name);
    let mdl = dir.join("m.mdl");
    ok(
        memc(&["import", "tests/onnx/dynamic_batch.onnx", "-o", s(&mdl)]),
        "import",
    );
    (dir, mdl)
}

/// ReduceSum without axes and with `noop_with_empty_axes = 1` is the identity (onnxruntime
/// 1.20 cannot run this model: it reduces every axis and then fails its own output check).
#[test]
fn reduce_sum_with_noop_and_no_axes_is_the_identity() {
    let dir = scratch("reduce-noop");
    let mdl = dir.join("m.mdl");
    let model = Path::new(ROOT).join("tests/onnx/reduce_noop.onnx");
    ok(memc(&["import", s(&model), "-o", s(&mdl)]), "import");
    let text = std::fs::read_to_string(&mdl).expect("mdl");
    assert!(text.contains("output y = h"), "{text}");
    assert!(!text.contains("sum("), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dynamic_batch_becomes_a_settable_dim() {
    let (dir, mdl) = import_dynamic_batch("dynamic");
    let text = std::fs::read_to_string(&mdl).expect("mdl");
    for want in ["dim N = 1", "input x: [N, 3, 8, 8]", "reshape(p, (N, 64))"] {
        assert!(text.contains(want), "no `{want}` in:\n{text}");
    }
    let out = dir.join("out");
    ok(
        memc(&[
            "run",
            s(&mdl),
            "--set",
            "N=3",
            "--params",
            s(&dir.join("m.safetensors")),
            "--dump",
            s(&out),
        ]),
        "run with N=3",
    );
    let (shape, prob) = floats(&out.join("output.prob.npy"));
    assert_eq!(shape, [3, 5]);
    for row in prob.chunks(5) {
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5, "{row:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn inference_plan_frees_every_value_after_its_last_use() {
    let (dir, mdl) = import_dynamic_batch("report");
    let report = ok(memc(&["compile", s(&mdl), "--format", "json"]), "compile");
    let v: serde_json::Value = serde_json::from_str(&report).expect("json");
    let r = &v["report"];
    assert_eq!(r["bytes"]["activations"].as_u64(), Some(0), "{r:#}");
    assert_eq!(r["saved"].as_array().map(Vec::len), Some(0), "{r:#}");
    let (arena, no_reuse) = (
        r["bytes"]["arena"].as_u64(),
        r["bytes"]["no_reuse"].as_u64(),
    );
    assert!(arena < no_reuse, "{r:#}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn broken_files_get_diagnostics() {
    let dir = scratch("errors");
    insta::glob!("onnx/errors", "*.onnx", |path| {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        let mdl = dir.join(format!("{name}.mdl"));
        let out = memc(&["import", s(path), "-o", s(&mdl)]);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{name}: exit code, stderr:\n{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{name}: panic:\n{stderr}");
        assert!(stderr.contains("help:"), "{name}: no help line:\n{stderr}");
        assert!(!mdl.exists(), "{name}: wrote a model anyway");
        insta::assert_snapshot!("stderr", stderr);
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// A comparison as a graph output is a 0/1 mask that the `.mdl` and `memc import` call a
/// boolean, and it holds 1 where the comparison is true.
#[test]
fn comparison_output_is_a_boolean_mask() {
    use memc::exec::cpu::CpuExecutor;
    let bytes = std::fs::read(Path::new(ROOT).join("tests/onnx/bool_output.onnx")).expect("model");
    let imported = memc::onnx::import(&bytes, "less").expect("import");
    assert_eq!(imported.boolean_outputs, ["z"]);
    assert!(
        imported
            .mdl
            .contains("output z = z  # an ONNX bool: 1 for true, 0 for false"),
        "{}",
        imported.mdl
    );
    let plan = memc::compile(&imported.mdl, &memc::Options::default())
        .map_err(|e| format!("{e:?}"))
        .expect("compile")
        .plan;
    let p = plan.plan();
    let mut ex = CpuExecutor::new(&plan).expect("executor");
    for (name, data) in [("x", [1.0, 2.0, 3.0, 4.0, -1.0, 0.5]), ("y", [3.0; 6])] {
        let b = p.inputs.iter().find(|b| b.name == name).expect("input");
        ex.bind_input(b.buffer, data.to_vec()).expect("bind");
    }
    ex.run_step(None).expect("run");
    let (_, z) = p.outputs.iter().find(|(n, _)| n == "z").expect("output");
    assert_eq!(ex.read(*z)[..], [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]);
    let dir = scratch("bool-output");
    let mdl = dir.join("m.mdl");
    let model = Path::new(ROOT).join("tests/onnx/bool_output.onnx");
    let out = memc(&["import", s(&model), "-o", s(&mdl)]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("z -> output.z.npy (bool as 1/0)"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// ONNX's LRN window of an even size holds the extra channel after the centre (c - 0 to
/// c + 1 for size 2), as `lrn` computes it and the README says; PyTorch's window (c - 1 to
/// c) would give [1/2, 1/3, 3/14] here.
#[test]
fn lrn_of_an_even_size_places_its_window_as_onnx_does() {
    use memc::exec::cpu::CpuExecutor;
    let src = "model lrn_even {
  input x: [1, 3, 1, 1]
  output y = lrn(x, size = 2, alpha = 2, beta = 1, bias = 1)
}
";
    let plan = memc::compile(src, &memc::Options::default())
        .map_err(|e| format!("{e:?}"))
        .expect("compile")
        .plan;
    let p = plan.plan();
    let mut ex = CpuExecutor::new(&plan).expect("executor");
    ex.bind_input(p.inputs[0].buffer, vec![1.0, 2.0, 3.0])
        .expect("bind");
    ex.run_step(None).expect("run");
    let (_, y) = p.outputs[0];
    // y_c = x_c / (1 + (2 / 2) * sum of x_k^2 over the window).
    let want = [1.0 / 6.0, 2.0 / 14.0, 3.0 / 10.0];
    let got = ex.read(y);
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-6, "got {got:?}, want {want:?}");
    }
}

/// Names sharing a `gpu_0/` prefix lose it in the `.mdl`, the input's ONNX name noted beside
/// it; `memc run --input` takes either name and binds the same tensor.
#[test]
fn an_imported_input_binds_by_its_onnx_name_too() {
    let dir = scratch("prefixed-names");
    let mdl = dir.join("m.mdl");
    let model = Path::new(ROOT).join("tests/onnx/prefixed_names.onnx");
    ok(memc(&["import", s(&model), "-o", s(&mdl)]), "import");
    let text = std::fs::read_to_string(&mdl).expect("mdl");
    assert!(
        text.contains("input data_0: [2, 4]  # ONNX input `gpu_0/data_0`"),
        "{text}"
    );
    let x = dir.join("x.npy");
    let mut bytes = Vec::new();
    {
        use npyz::WriterBuilder;
        let mut w = npyz::WriteOptions::<f32>::new()
            .default_dtype()
            .shape(&[2, 4])
            .writer(&mut bytes)
            .begin_nd()
            .expect("npy writer");
        w.extend((0..8).map(|i| i as f32 - 3.5)).expect("npy data");
        w.finish().expect("npy end");
    }
    std::fs::write(&x, bytes).expect("write x");
    let outputs: Vec<Vec<f32>> = ["gpu_0/data_0", "data_0"]
        .iter()
        .map(|name| {
            let out = dir.join(name.replace('/', "-"));
            let input = format!("{name}={}", x.display());
            ok(
                memc(&["run", s(&mdl), "--input", &input, "--dump", s(&out)]),
                "run",
            );
            floats(&out.join("output.y.npy")).1
        })
        .collect();
    assert_eq!(outputs[0], outputs[1]);
    let unknown = memc(&["run", s(&mdl), "--input", "gpu_1/data_0=x.npy"]);
    assert_eq!(unknown.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}
