//! The example models: a snapshot of each one's text memory report, their exact parameter
//! counts, the shape of the JSON report and the origins (role, line) it gives each buffer.
#![allow(clippy::panic)]

use memc::{compile, Compiled, Options};
use std::path::Path;
use std::time::Duration;

fn source(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn compiled(src: &str, options: &Options, what: &str) -> Compiled {
    match compile(src, options) {
        Ok(c) => c,
        Err(e) => panic!("{what} does not compile: {e:?}"),
    }
}

/// Options for snapshots: the layout search gets no node budget, so the arena is the
/// heuristic's layout and cannot depend on how fast (or how loaded) the machine is.
fn snapshot_options() -> Options {
    Options {
        layout_time: Duration::ZERO,
        ..Options::default()
    }
}

#[test]
fn example_reports() {
    insta::glob!("../examples", "*.mdl", |path| {
        let src = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let c = compiled(&src, &snapshot_options(), &path.display().to_string());
        insta::assert_snapshot!("report", memc::plan::render_text(c.plan.plan()));
    });
}

fn param_count(name: &str) -> u64 {
    compiled(&source(name), &Options::default(), name)
        .plan
        .plan()
        .report
        .param_count
}

#[test]
fn gpt2_param_count() {
    assert_eq!(param_count("gpt2.mdl"), 124_439_808);
}

#[test]
fn llama7b_param_count() {
    assert_eq!(param_count("llama7b.mdl"), 6_738_415_616);
}

#[test]
fn resnet18_param_count() {
    assert_eq!(param_count("resnet18.mdl"), 11_689_512);
}

/// Stable Diffusion 1.5's UNet as diffusers counts it (`sum(p.numel() for p in
/// unet.parameters())`).
/// The 3-D UNet's count, summed by hand over its layers: seven blocks of two bias-free 3x3x3
/// convolutions, each followed by a batch norm's weight and bias; three 2x2x2 transposed
/// convolutions and the 1x1x1 head, with biases: 5,601,220.
#[test]
fn unet3d_param_count() {
    assert_eq!(param_count("unet3d.mdl"), 5_601_220);
}

#[test]
fn sd_unet_param_count() {
    assert_eq!(param_count("sd_unet.mdl"), 859_520_964);
}

#[test]
fn llama7b_overrides_scale_the_count() {
    // Two layers: embeddings + head + final norm + 2 * (4 D^2 + 3 D F + 2 D).
    let (v, d, f) = (32_000u64, 4096u64, 11_008u64);
    let want = 2 * v * d + d + 2 * (4 * d * d + 3 * d * f + 2 * d);
    let opts = Options {
        overrides: vec![("L".into(), 2)],
        ..snapshot_options()
    };
    let c = compiled(&source("llama7b.mdl"), &opts, "llama7b with L=2");
    assert_eq!(c.plan.plan().report.param_count, want);
}

#[test]
fn json_report_has_integer_byte_counts() {
    for name in [
        "gpt2.mdl",
        "llama7b.mdl",
        "mlp.mdl",
        "resnet18.mdl",
        "unet.mdl",
    ] {
        let c = compiled(&source(name), &snapshot_options(), name);
        let json = match serde_json::to_value(c.plan.plan()) {
            Ok(j) => j,
            Err(e) => panic!("{name}: plan does not serialize: {e}"),
        };
        let report = &json["report"];
        assert!(
            report["param_count"].is_u64(),
            "{name}: report.param_count is {}",
            report["param_count"]
        );
        assert_eq!(
            report["param_count"].as_u64(),
            Some(c.plan.plan().report.param_count),
            "{name}"
        );
        for key in ["params", "grads", "optimizer", "activations", "peak"] {
            let v = &report["bytes"][key];
            assert!(
                v.is_u64(),
                "{name}: report.bytes.{key} is {v}, not an integer"
            );
        }
        // Parameter bytes hold the batch norms' running statistics too (fp32 state beside
        // the parameters, not counted among them).
        let plan = c.plan.plan();
        let running: u64 = plan
            .params
            .iter()
            .filter(|p| p.running_statistic)
            .map(|p| plan.buffers[p.buffer.index()].bytes)
            .sum();
        let bytes = &report["bytes"];
        assert_eq!(
            bytes["params"].as_u64(),
            Some(4 * plan.report.param_count + running),
            "{name}: fp32 params"
        );
        assert!(
            bytes["peak"].as_u64() >= bytes["params"].as_u64(),
            "{name}: peak below params"
        );
    }
}

/// The report's table of the largest tensors live at the peak points at the source: GPT-2's
/// names the loss head's gradient scratch (line 26, `loss = cross_entropy(...)`) among its
/// four largest, next to the tied embedding and its Adam moments; ResNet-18's largest
/// activation is the stem convolution's output (line 38). Every entry has a line; the
/// table is sorted by bytes.
#[test]
fn largest_tensors_at_the_peak_name_their_source_lines() {
    let report = |name: &str| {
        compiled(&source(name), &snapshot_options(), name)
            .plan
            .plan()
            .report
            .largest_at_peak
            .clone()
    };
    let gpt2 = report("gpt2.mdl");
    assert_eq!(gpt2.len(), 10);
    assert!(gpt2.windows(2).all(|w| w[0].bytes >= w[1].bytes));
    assert!(gpt2.iter().all(|t| t.line.is_some() && t.code.is_some()));
    assert!(
        gpt2[..4].iter().any(|t| t.line == Some(26)
            && t.code
                .as_deref()
                .is_some_and(|c| c.starts_with("loss = cross_entropy"))),
        "{gpt2:?}"
    );
    let resnet = report("resnet18.mdl");
    let first_activation = resnet
        .iter()
        .find(|t| t.class == memc::plan::BufferClass::Activation)
        .unwrap_or_else(|| panic!("{resnet:?}"));
    assert_eq!(first_activation.line, Some(38), "{resnet:?}");
    assert!(first_activation
        .code
        .as_deref()
        .is_some_and(|c| c.contains("conv2d(images, stem")));
}

/// The summary names the lines whose activations backward keeps the most of: GPT-2's loss
/// head (line 26, its logits) when the head is not fused, the MLP (line 19) when the fused
/// head keeps no logits; ResNet-18's stem convolution (line 38).
#[test]
fn summary_names_the_line_keeping_the_most_activations() {
    let summary = |name: &str, fuse_loss: bool| {
        let options = Options {
            fuse_loss,
            ..snapshot_options()
        };
        let text = memc::plan::render_text(compiled(&source(name), &options, name).plan.plan());
        let line = text
            .lines()
            .find(|l| l.contains("activations kept for backward"));
        line.unwrap_or_else(|| panic!("{name}: {text}")).to_string()
    };
    let unfused = summary("gpt2.mdl", false);
    assert!(
        unfused.contains("the most from line 26 (loss = cross_entropy(layernorm(x, lnf) @ tran...): 1.5 GiB in 1 tensor;"),
        "{unfused}"
    );
    insta::assert_snapshot!("gpt2_unfused_summary", unfused);
    let fused = summary("gpt2.mdl", true);
    assert!(
        fused.contains("the most from line 19 (x = x + mlp("),
        "{fused}"
    );
    let resnet = summary("resnet18.mdl", true);
    assert!(
        resnet.contains("the most from line 38 (let x = relu(batchnorm(conv2d(images, stem"),
        "{resnet}"
    );
}

/// `memc compile --format json` gives every buffer its origin: role, span and line, and the
/// text of each line named.
#[test]
fn json_report_gives_each_buffer_its_origin() {
    let gpt2 = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/gpt2.mdl");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_memc"))
        .args(["compile", gpt2, "--format", "json", "--layout-time", "0"])
        .args([
            "--set", "L=2", "--set", "D=64", "--set", "T=32", "--set", "V=256", "--set", "H=4",
        ])
        .output()
        .unwrap_or_else(|e| panic!("memc: {e}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}"));
    let buffers = v["buffers"]
        .as_array()
        .unwrap_or_else(|| panic!("no buffers: {v}"));
    let role = |b: &serde_json::Value| b["role"]["kind"].as_str().unwrap_or("").to_string();
    for b in buffers {
        assert!(!role(b).is_empty(), "{b}");
        if let Some(line) = b["line"].as_u64() {
            assert!(b["span"]["start"].is_u64(), "{b}");
            assert!(v["source_lines"][line.to_string()].is_string(), "{b}");
        }
    }
    let find = |name: &str| {
        (buffers.iter().find(|b| b["name"] == name)).unwrap_or_else(|| panic!("no {name}"))
    };
    assert_eq!(
        find("grad.wte")["role"],
        serde_json::json!({"kind": "gradient", "of": "wte"})
    );
    let moment = find("wte.exp_avg");
    assert_eq!(
        moment["role"],
        serde_json::json!({"kind": "adam_moment", "of": "wte"})
    );
    assert_eq!(moment["line"], 6);
    assert_eq!(v["source_lines"]["6"], "param  wte: [V, D] = normal(0.02)");
    let kinds: std::collections::BTreeSet<String> = buffers.iter().map(role).collect();
    for kind in [
        "parameter",
        "input",
        "saved_activation",
        "recomputed",
        "backward_temporary",
    ] {
        assert!(kinds.contains(kind), "no {kind} in {kinds:?}");
    }
    let largest = &v["report"]["largest_at_peak"][0];
    assert!(
        largest["role"]["kind"].is_string() && largest["line"].is_u64(),
        "{largest}"
    );
}

/// The clip coefficient belongs to no parameter: its line is where `clip_grad_norm` is set.
#[test]
fn the_clip_coefficient_points_at_clip_grad_norm() {
    let c = compiled(&source("unet.mdl"), &snapshot_options(), "unet");
    let plan = c.plan.plan();
    let Some(clip) = plan
        .buffers
        .iter()
        .find(|b| b.name.starts_with("clip_coefficient"))
    else {
        panic!("no clip coefficient")
    };
    let Some(line) = clip.line else {
        panic!("the clip coefficient has no line")
    };
    assert!(plan.source_lines[&line].starts_with("clip_grad_norm = 1.0"));
    assert!(
        plan.buffers.iter().all(|b| b.line.is_some()),
        "a buffer without a line"
    );
}
