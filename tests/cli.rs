//! The command line: exit codes, `--dump` files, and diagnostics for bad run-time files.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use common::{assert_success, memc, scratch, MLP};

#[test]
fn dump_writes_loss_and_every_gradient() {
    let dir = scratch("dump");
    let out = memc(&[
        "run",
        MLP,
        "--set",
        "B=4",
        "--dump",
        dir.to_str().unwrap_or_default(),
    ]);
    assert_success(&out);
    for name in [
        "loss.npy",
        "grad.fc1.weight.npy",
        "grad.fc1.bias.npy",
        "grad.fc2.weight.npy",
        "grad.fc2.bias.npy",
    ] {
        let bytes = std::fs::read(dir.join(name)).unwrap_or_else(|_| panic!("{name} missing"));
        let data = memc::exec::io::read_npy(&bytes).expect("npy");
        if name == "grad.fc2.weight.npy" {
            assert!(matches!(data, memc::exec::io::TensorData::F32(ref s, _) if s == &[256, 10]));
        }
    }
}

#[test]
fn plan_json_round_trips_through_run() {
    let dir = scratch("plan");
    let plan = dir.join("plan.json");
    let out = memc(&[
        "compile",
        MLP,
        "--set",
        "B=4",
        "--emit",
        "plan",
        "-o",
        plan.to_str().unwrap_or_default(),
    ]);
    assert!(out.status.success());
    let direct = memc(&["run", MLP, "--set", "B=4", "--steps", "3"]);
    let from_plan = memc(&["run", plan.to_str().unwrap_or_default(), "--steps", "3"]);
    assert_success(&from_plan);
    assert_eq!(direct.stdout, from_plan.stdout);
    assert_eq!(String::from_utf8_lossy(&direct.stdout).lines().count(), 3);
    // Compile options cannot change a compiled plan: they are refused, never ignored.
    let path = plan.to_str().unwrap_or_default();
    for flags in [
        &["--set", "NOPE=4"][..],
        &["--precision", "bf16", "--accumulate", "2"],
        &["--checkpoint", "sqrt"],
        &["--budget", "1GiB", "--layout-time", "1"],
    ] {
        let out = memc(&[&["run", path][..], flags].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {stderr}");
        assert!(stderr.contains("is a compiled plan"), "{stderr}");
        assert!(stderr.contains(flags[0]), "{flags:?}: {stderr}");
    }
}

#[test]
fn params_round_trip_and_bad_files_exit_2() {
    let dir = scratch("params");
    let saved = dir.join("p.safetensors");
    let s = saved.to_str().unwrap_or_default();
    assert!(memc(&["run", MLP, "--set", "B=4", "--save-params", s])
        .status
        .success());
    let ok = memc(&["run", MLP, "--set", "B=4", "--params", s]);
    assert_success(&ok);
    let wrong_shape = memc(&["run", MLP, "--set", "H=32", "--set", "B=4", "--params", s]);
    assert_eq!(wrong_shape.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&wrong_shape.stderr).contains("the model expects"));
    let garbage = dir.join("junk.safetensors");
    std::fs::write(&garbage, b"not a tensor file").expect("write");
    assert_eq!(
        memc(&["run", MLP, "--params", garbage.to_str().unwrap_or_default()])
            .status
            .code(),
        Some(2)
    );
    let bad_input = dir.join("x.npy");
    std::fs::write(
        &bad_input,
        memc::exec::io::write_npy(&[2, 3], &[0.0; 6]).expect("npy"),
    )
    .expect("write");
    let spec = format!("images={}", bad_input.display());
    let out = memc(&["run", MLP, "--input", &spec]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("the model expects f32[64, 784]"));
    let unknown = memc(&["run", MLP, "--input", "nope=x.npy"]);
    assert_eq!(unknown.status.code(), Some(2));
}

#[test]
fn cuda_without_a_driver_exits_2() {
    let out = memc(&["run", MLP, "--device", "cuda"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--device cpu"));
}

#[test]
fn arena_command_checks_capacity_and_csv() {
    let dir = scratch("arena");
    let csv = dir.join("i.csv");
    std::fs::write(&csv, "id,lower,upper,size\n0,0,3,4\n1,1,2,4\n2,2,4,4\n").expect("write");
    let solved = dir.join("o.csv");
    let out = memc(&[
        "arena",
        csv.to_str().unwrap_or_default(),
        "--capacity",
        "8",
        "-o",
        solved.to_str().unwrap_or_default(),
    ]);
    assert_success(&out);
    assert!(std::fs::read_to_string(&solved)
        .expect("solution")
        .starts_with("id,lower,upper,size,offset"));
    assert_eq!(
        memc(&["arena", csv.to_str().unwrap_or_default(), "--capacity", "7"])
            .status
            .code(),
        Some(2)
    );
    std::fs::write(&csv, "id,lower,upper,size\n0,3,3,4\n").expect("write");
    assert_eq!(
        memc(&["arena", csv.to_str().unwrap_or_default()])
            .status
            .code(),
        Some(2)
    );
}

#[test]
fn tampered_plan_json_is_refused() {
    let dir = scratch("tamper");
    let plan = dir.join("plan.json");
    let p = plan.to_str().unwrap_or_default();
    assert!(
        memc(&["compile", MLP, "--set", "B=4", "--emit", "plan", "-o", p])
            .status
            .success()
    );
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
    let step = json["steps"]
        .as_array()
        .unwrap()
        .iter()
        .position(|s| s["op"]["op"] == "mat_mul")
        .unwrap();
    let out = json["steps"][step]["output"].as_u64().unwrap() as usize;
    json["buffers"][out]["ty"]["shape"] = serde_json::json!([1]);
    json["buffers"][out]["bytes"] = serde_json::json!(4);
    std::fs::write(&plan, json.to_string()).unwrap();
    let run = memc(&["run", p]);
    assert_eq!(run.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&run.stderr).contains("fails plan verification"),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

#[test]
fn fit_accumulate_reports_the_micro_batch_and_compile_wants_a_count() {
    let gpt2 = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/gpt2.mdl");
    let out = memc(&[
        "fit",
        gpt2,
        "--budget",
        "4GiB",
        "--checkpoint",
        "none",
        "--format",
        "json",
        "--accumulate",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_success(&out);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let got = ["batch", "micro_batch", "accumulate", "next_micro_batch"].map(|k| v[k].as_i64());
    assert_eq!(got, [Some(8), Some(2), Some(4), Some(4)], "{text}");
    assert!(v["arena_bytes"].as_u64().unwrap() <= 4 << 30, "{text}");
    let out = memc(&["compile", MLP, "--accumulate"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--accumulate needs a count"), "{stderr}");
}

/// Files memc writes get the mode a plain create gives (0666 less the umask), not 0600.
#[cfg(unix)]
#[test]
fn written_files_follow_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("umask");
    for (umask, mode) in [("022", 0o644), ("077", 0o600), ("002", 0o664)] {
        let out_file = dir.join(format!("plan-{umask}.json"));
        let script = format!("umask {umask} && exec \"$0\" compile \"$1\" --emit plan -o \"$2\"",);
        let status = std::process::Command::new("sh")
            .args(["-c", &script, env!("CARGO_BIN_EXE_memc"), MLP])
            .arg(&out_file)
            .status()
            .unwrap();
        assert!(status.success());
        let got = std::fs::metadata(&out_file).unwrap().permissions().mode() & 0o777;
        assert_eq!(got, mode, "umask {umask}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn checkpoint_policies_parse_and_bad_ones_exit_2() {
    for policy in [
        "block",
        "every=2",
        "first=1",
        "sqrt",
        "selective",
        "mincut",
        "pointwise",
        "none",
        "auto",
    ] {
        assert_success(&memc(&["check", MLP, "--checkpoint", policy]));
    }
    for (policy, message, label) in [
        (
            "every=0",
            "`0` is not a positive block count",
            "expected an integer of at least 1",
        ),
        (
            "every=two",
            "`two` is not a positive block count",
            "expected an integer",
        ),
        (
            "every",
            "`every` needs a block count: every=K",
            "no block count",
        ),
        (
            "every=",
            "`every` needs a block count: every=K",
            "no block count",
        ),
        (
            "first=0",
            "`0` is not a positive block count",
            "expected an integer of at least 1",
        ),
        (
            "first",
            "`first` needs a block count: first=K",
            "no block count",
        ),
        (
            "blocks",
            "unknown checkpointing policy `blocks`",
            "not a policy",
        ),
    ] {
        let out = memc(&["check", MLP, "--checkpoint", policy]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{policy}: {stderr}");
        assert!(stderr.contains(message), "{policy}: {stderr}");
        assert!(
            stderr.contains("╭─[--checkpoint:1:"),
            "{policy}: no frame: {stderr}"
        );
        assert!(stderr.contains(label), "{policy}: no label: {stderr}");
        assert!(stderr.contains("help:"), "{policy}: no help: {stderr}");
        assert!(!stderr.contains("panicked"), "{policy}: {stderr}");
    }
}

#[test]
fn gpu_estimates_the_step_in_text_and_json_and_unknown_names_exit_2() {
    let text = memc(&["compile", MLP, "--device", "cuda", "--gpu", "h100"]);
    assert_success(&text);
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert!(
        stdout.contains("estimated step time on H100 SXM (132 SMs): ")
            && stdout.contains("not a measurement")
            && stdout.contains("launch overhead")
            && stdout.contains("    matmul "),
        "{stdout}"
    );
    let json = memc(&["compile", MLP, "--gpu", "RTX4090", "--format", "json"]);
    assert_success(&json);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let e = &v["report"]["estimate"];
    assert_eq!(e["gpu"], "rtx4090", "{e}");
    let parts = [
        "compute_bound_seconds",
        "memory_bound_seconds",
        "launch_seconds",
    ]
    .map(|k| e[k].as_f64().unwrap());
    let total = e["seconds"].as_f64().unwrap();
    assert!(
        (parts.iter().sum::<f64>() - total).abs() <= 1e-12 * total,
        "{e}"
    );
    assert!(e["launches"].as_u64().unwrap() > 0 && e["by_op"][0]["op"].is_string());
    let bounds = e["steps"].as_array().unwrap().iter().map(|s| &s["bound"]);
    assert!(
        bounds.clone().all(|b| b == "compute" || b == "memory"),
        "{e}"
    );
    assert!(bounds.clone().any(|b| b == "memory"), "{e}");
    let plain = memc(&["compile", MLP, "--format", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&plain.stdout).unwrap();
    assert!(
        v["report"].get("estimate").is_none(),
        "no --gpu, no estimate"
    );
    let bad = memc(&["compile", MLP, "--gpu", "v100"]);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("unknown GPU `v100`"), "{stderr}");
    assert!(
        stderr.contains("use one of: a100, h100, h200, gh200, rtx4090"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `memc emit` writes every kernel's source and a manifest naming its launch; where NVRTC
/// loads, each kernel's PTX and ptxas's figures for the GPU's architecture (sm_90 for the
/// default H100; no library call: every step is a generated kernel), and the device bytes
/// the kernels fix: module images and local memory.
#[test]
fn emit_writes_sources_and_a_manifest_with_ptxas_figures() {
    let dir = scratch("emit");
    let out = memc(&["emit", MLP, "-o", dir.to_str().unwrap_or_default()]);
    assert_success(&out);
    let text = std::fs::read_to_string(dir.join("manifest.json")).expect("manifest");
    let manifest: serde_json::Value = serde_json::from_str(&text).expect("json");
    let kernels = manifest.as_array().expect("array");
    assert!(!kernels.is_empty());
    let nvrtc = memc::codegen::nvrtc::nvrtc_available();
    for k in kernels {
        let Some(source) = k["source"].as_str() else {
            // A step of library calls alone (the matmuls' cuBLASLt GEMMs): no source.
            let calls = k["library"].as_array().expect("library calls");
            assert!(calls.iter().all(|c| c.get("Gemm").is_some()), "{k}");
            continue;
        };
        assert!(dir.join(source).is_file(), "{source}");
        assert!(k["library"].is_null(), "{k}");
        if nvrtc {
            assert!(dir.join(k["ptx"].as_str().expect("ptx")).is_file(), "{k}");
            assert_eq!(k["sm"], "sm_90", "{k}");
            assert!(k["resources"]["registers"].as_u64().unwrap_or(0) > 0, "{k}");
            assert_eq!(k["resources"]["spill_store_bytes"].as_u64(), Some(0), "{k}");
        }
    }
    if nvrtc {
        let text = std::fs::read_to_string(dir.join("device.json")).expect("device.json");
        let device: serde_json::Value = serde_json::from_str(&text).expect("json");
        let field = |name: &str| device[name].as_u64().unwrap_or(0);
        assert!(field("arena") > 0 && field("modules") > 0, "{device}");
        // No MLP kernel has a stack frame, so no local memory is reserved.
        assert_eq!(
            (field("local_per_thread"), field("local")),
            (0, 0),
            "{device}"
        );
        assert_eq!(
            field("total"),
            field("arena") + field("modules") + field("local")
        );
    }
    assert!(
        nvrtc || std::env::var("MEMC_REQUIRE_NVRTC").as_deref() != Ok("1"),
        "NVRTC required"
    );
}

#[test]
fn bench_compile_times_each_example_in_its_own_process() {
    let dir = scratch("bench-compile");
    std::fs::copy("examples/unet.mdl", dir.join("unet.mdl")).unwrap();
    let out = memc(&["bench", "compile", dir.to_str().unwrap_or_default()]);
    assert_success(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text
        .lines()
        .find(|l| l.starts_with("unet"))
        .unwrap_or_else(|| panic!("no unet row in {text}"));
    let fields: Vec<&str> = row.split_whitespace().collect();
    let (seconds, rss): (f64, f64) = (fields[2].parse().unwrap(), fields[3].parse().unwrap());
    assert!(seconds > 0.0 && rss > 1.0, "{row}");
    assert!(
        !text.contains("llama7b"),
        "only the examples present are run: {text}"
    );
}

/// A second `memc emit` into the same folder leaves only its own kernel files (those the
/// first manifest listed and the second does not are removed) and nothing else touched.
#[test]
fn emit_into_a_previous_emit_removes_its_stale_kernels() {
    let dir = scratch("emit-again");
    let path = dir.to_str().unwrap_or_default();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("notes.cu"), "// mine\n").unwrap();
    assert_success(&memc(&["emit", MLP, "-o", path]));
    assert_success(&memc(&["emit", MLP, "--precision", "bf16", "-o", path]));
    let text = std::fs::read_to_string(dir.join("manifest.json")).unwrap();
    let manifest: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut listed: Vec<String> = manifest
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|k| k["source"].as_str().map(str::to_string))
        .chain(["notes.cu".to_string()])
        .collect();
    listed.sort();
    let mut sources: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".cu"))
        .collect();
    sources.sort();
    assert_eq!(sources, listed);
    assert_eq!(
        std::fs::read_to_string(dir.join("notes.cu")).unwrap(),
        "// mine\n"
    );
}

/// `--dump` writes the gradients of the loss itself: in fp16 the scaled gradients the update
/// sees are divided by that step's loss scale, so they match fp32's within fp16's precision.
#[test]
fn fp16_dump_holds_unscaled_gradients() {
    let read = |precision: &str| {
        let dir = scratch(&format!("dump-{precision}"));
        let out = memc(&[
            "run",
            MLP,
            "--set",
            "B=4",
            "--precision",
            precision,
            "--dump",
            dir.to_str().unwrap_or_default(),
        ]);
        assert_success(&out);
        let bytes = std::fs::read(dir.join("grad.fc2.weight.npy")).unwrap();
        match memc::exec::io::read_npy(&bytes).unwrap() {
            memc::exec::io::TensorData::F32(_, data) => data,
            _ => panic!("not f32"),
        }
    };
    let (exact, half) = (read("fp32"), read("fp16"));
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    let diff: Vec<f32> = exact.iter().zip(&half).map(|(a, b)| a - b).collect();
    assert!(norm(&exact) > 0.0);
    assert!(
        norm(&diff) <= 0.02 * norm(&exact),
        "fp16 {} vs fp32 {}",
        norm(&half),
        norm(&exact)
    );
}

/// `compile --summary` lays the plan out as PyTorch's memory_summary(): its rows hold the
/// plan's own figures (the arena as reserved memory, the sum of all buffers as allocated in
/// all, what outlives the step as parameters and optimizer state); with --device cuda the
/// stated CUDA context joins the reserved memory; it does not combine with --format.
#[test]
fn compile_summary_is_a_memory_summary_table_of_the_plan() {
    let c = common::compiled(&std::fs::read_to_string(MLP).unwrap());
    let plan = c.plan.plan();
    let out = memc(&["compile", MLP, "--summary"]);
    assert_success(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    let row = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("| {name}")))
            .unwrap_or_else(|| panic!("{name}: {text}"))
            .to_string()
    };
    let h = memc::plan::human_bytes;
    assert!(
        row("Reserved memory (arena)").contains(&h(plan.arena_bytes)),
        "{text}"
    );
    assert!(
        row("Allocated memory").contains(&h(plan.report.bytes.no_reuse)),
        "{text}"
    );
    let persistent = plan.report.bytes.params + plan.report.bytes.optimizer;
    assert!(row("Allocated memory").contains(&h(persistent)), "{text}");
    assert!(!text.contains("CUDA context"), "{text}");
    let gpu = memc(&["compile", MLP, "--summary", "--device", "cuda"]);
    assert!(String::from_utf8_lossy(&gpu.stdout).contains("+ CUDA context (stated) |    529.0 MiB"));
    let both = memc(&["compile", MLP, "--summary", "--format", "json"]);
    assert_eq!(both.status.code(), Some(2));
}

/// `memc run` takes targets holding the id `cross_entropy(.., ignore_index = -100)` ignores,
/// and refuses (exit 2, naming the id) a target outside the classes that is not it.
#[test]
fn run_accepts_the_ignored_target_id_and_refuses_other_bad_ids() {
    let dir = scratch("ignore");
    let model = dir.join("ce.mdl");
    std::fs::write(
        &model,
        "model ce {\n  dim N = 4, C = 3\n  param x: [N, C] = normal(1.0)\n  input t: i32[N]\n  loss = cross_entropy(x * 2, t, ignore_index = -100)\n  train { optimizer = sgd(lr = 0.1) }\n}\n",
    )
    .unwrap();
    let run = |ids: &[i32]| {
        let path = dir.join("t.npy");
        let mut bytes = Vec::new();
        use npyz::WriterBuilder;
        let mut w = npyz::WriteOptions::<i32>::new()
            .default_dtype()
            .shape(&[4])
            .writer(&mut bytes)
            .begin_nd()
            .unwrap();
        w.extend(ids.iter().copied()).unwrap();
        w.finish().unwrap();
        std::fs::write(&path, bytes).unwrap();
        let input = format!("t={}", path.display());
        memc(&["run", model.to_str().unwrap(), "--input", &input])
    };
    assert_success(&run(&[0, -100, 2, -100]));
    let bad = run(&[0, -100, 3, 1]);
    assert_eq!(bad.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.contains("id 3 in `t` is outside 0..3 and is not the ignored id -100"),
        "{stderr}"
    );
}

/// Every model the README shows (fenced blocks that start with `model`) passes `memc check`.
#[test]
fn readme_models_check() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let dir = scratch("readme");
    let models: Vec<&str> = readme
        .split("```")
        .skip(1)
        .step_by(2)
        .map(|block| block.split_once('\n').map_or("", |(_, body)| body))
        .filter(|body| body.trim_start().starts_with("model "))
        .collect();
    assert!(!models.is_empty(), "the README shows no model");
    for (i, body) in models.iter().enumerate() {
        let path = dir.join(format!("readme{i}.mdl"));
        std::fs::write(&path, body).expect("write");
        let out = memc(&["check", path.to_str().unwrap_or_default()]);
        assert_success(&out);
    }
}

/// A budget from `--budget` is not blamed on the file: no frame around `train { }`, and the
/// help says whose budget it is; the file's own budget is underlined where it is set.
#[test]
fn a_command_line_budget_is_not_underlined_in_the_file() {
    let file = "tests/errors/budget_exceeded.mdl";
    let out = common::memc(&["check", file, "--budget", "2KiB"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("budget of 2.0 KiB"), "{stderr}");
    assert!(stderr.contains("the budget is --budget's"), "{stderr}");
    assert!(!stderr.contains("budget set here"), "{stderr}");
    let out = common::memc(&["check", file]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("budget set here"), "{stderr}");
    assert!(stderr.contains("takes 2.0 MiB"), "{stderr}");
}
