//! `memc viz`: one rectangle per buffer, the legend and tables, no external resources; and,
//! where Chromium is installed, the page loads headless without console errors.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use common::assert_success;
use memc::plan::{BufferClass, Plan};
use memc::{compile, Options};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn plan_of(src: &str, sets: &[(&str, i64)]) -> Plan {
    let opts = Options {
        overrides: sets.iter().map(|&(k, v)| (k.to_string(), v)).collect(),
        layout_time: Duration::ZERO,
        ..Options::default()
    };
    match compile(src, &opts) {
        Ok(c) => c.plan.plan().clone(),
        Err(e) => panic!("does not compile: {e:?}"),
    }
}

fn example(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name);
    std::fs::read_to_string(&path).unwrap()
}

/// The buffers that hold bytes of their own (views are drawn as their roots).
fn owned(plan: &Plan) -> Vec<&memc::plan::Buffer> {
    plan.buffers
        .iter()
        .filter(|b| b.view_of.is_none())
        .collect()
}

fn check_page(plan: &Plan, html: &str) {
    let rects = html.matches(r#"<rect class="buf "#).count();
    assert_eq!(rects, owned(plan).len(), "one <rect> per buffer");
    for b in owned(plan) {
        assert!(
            html.contains(&format!(r#"data-i="{}""#, b.id.0)),
            "buffer {} has no rect",
            b.id
        );
    }
    assert!(html.contains(r#"id="legend""#));
    assert!(html.contains("parameters"));
    assert!(html.contains(r#"id="peak-line""#) && html.contains(r#"id="arena-line""#));
    assert!(html.contains(r#"id="phases""#) && html.contains(r#"id="totals""#));
    for p in &plan.report.phases {
        let name = format!("{:?}", p.phase).to_lowercase();
        assert!(html.contains(&format!("<td>{name}</td>")), "phase {name}");
    }
    assert!(!html.to_lowercase().contains("http"), "external URL");
    assert!(
        !html.contains("<link") && !html.contains(" src="),
        "external resource"
    );
    // The hover text of the largest buffer names it with its exact bytes.
    let big = plan.buffers.iter().max_by_key(|b| b.bytes).unwrap();
    let grouped = big
        .bytes
        .to_string()
        .as_bytes()
        .rchunks(3)
        .rev()
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect::<Vec<_>>()
        .join(",");
    assert!(html.contains(&format!("{} bytes", grouped)), "{}", big.name);
}

#[test]
fn mlp_page_has_every_buffer_and_the_legend() {
    let plan = plan_of(&example("mlp.mdl"), &[]);
    let html = memc::viz::render_html(&plan);
    check_page(&plan, &html);
}

#[test]
fn gpt2_page_renders_every_buffer() {
    let plan = plan_of(&example("gpt2.mdl"), &[]);
    assert!(plan.buffers.len() > 1000);
    let html = memc::viz::render_html(&plan);
    check_page(&plan, &html);
    assert!(html.len() < 4 << 20, "{} bytes", html.len());
    // The table of the largest tensors at the peak names the loss head's source line.
    assert!(html.contains(r#"<table id="largest">"#));
    assert!(
        html.contains("line 26: loss = cross_entropy(layernorm(x, lnf) @ transpose(wte), targets)"),
        "no loss head row"
    );
}

#[test]
fn inference_page() {
    let src = "model m {\n  dim N = 4\n  input x: [N, 8]\n  param w: linear(8, 4)\n  output y = relu(linear(x, w))\n}\n";
    let plan = plan_of(src, &[]);
    assert!(plan.train.is_none());
    let html = memc::viz::render_html(&plan);
    check_page(&plan, &html);
}

#[test]
fn live_bytes_peak_matches_the_report() {
    let plan = plan_of(
        &example("gpt2.mdl"),
        &[("L", 2), ("D", 64), ("T", 32), ("V", 256), ("H", 4)],
    );
    let live = plan.live_per_step();
    assert_eq!(live.len(), plan.steps.len());
    assert_eq!(live.iter().copied().max(), Some(plan.report.bytes.peak));
}

#[test]
fn the_stacked_view_splits_the_live_total_by_kind() {
    let plan = plan_of(
        &example("gpt2.mdl"),
        &[("L", 2), ("D", 64), ("T", 32), ("V", 256), ("H", 4)],
    );
    let live = plan.live_per_step();
    let kinds: Vec<Vec<u64>> = BufferClass::ALL
        .iter()
        .map(|&c| plan.live_per_step_of(|b| b.class == c))
        .collect();
    for (step, &total) in live.iter().enumerate() {
        let sum: u64 = kinds.iter().map(|k| k[step]).sum();
        assert_eq!(sum, total, "step {step}");
    }
    let html = memc::viz::render_html(&plan);
    assert!(html.contains(r#"<svg id="stacked""#));
    let present = kinds.iter().filter(|k| k.iter().any(|&v| v > 0)).count();
    assert_eq!(html.matches(r#"<polygon class="area "#).count(), present);
    for label in ["parameters", "optimizer state", "activations", "gradients"] {
        assert!(
            html.contains(&format!("<title>{label}: up to ")),
            "no {label} area"
        );
    }
}

fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

#[test]
fn cli_writes_the_page() {
    let dir = scratch();
    let out_path = dir.path().join("memory.html");
    let mlp = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/mlp.mdl");
    let out = Command::new(env!("CARGO_BIN_EXE_memc"))
        .args(["viz", mlp, "--set", "B=8", "--layout-time", "0", "-o"])
        .arg(&out_path)
        .output()
        .unwrap();
    assert_success(&out);
    let html = std::fs::read_to_string(&out_path).unwrap();
    let plan = plan_of(&example("mlp.mdl"), &[("B", 8)]);
    assert_eq!(html, memc::viz::render_html(&plan));
}

/// Whether `/usr/bin/chromium` exists; prints SKIP when it does not.
fn chromium_installed() -> bool {
    let installed = Path::new("/usr/bin/chromium").exists();
    if !installed {
        eprintln!("SKIP: chromium not installed");
    }
    installed
}

/// Runs chromium with `args` on `page`, killing it after two minutes; (stdout, stderr).
fn chromium(args: &[&str], page: &Path, profile: &Path) -> (String, String) {
    let mut child = Command::new("/usr/bin/chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read both pipes while waiting: the DOM dump is larger than a pipe buffer.
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let read_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut s);
        s
    });
    let read_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
        s
    });
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish in 120 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    (read_out.join().unwrap(), read_err.join().unwrap())
}

#[test]
fn chromium_loads_the_page_without_console_errors() {
    if !chromium_installed() {
        return;
    }
    let dir = scratch();
    let plan = plan_of(&example("gpt2.mdl"), &[]);
    let page = dir.path().join("memory.html");
    std::fs::write(&page, memc::viz::render_html(&plan)).unwrap();
    let (dom, log) = chromium(
        &["--enable-logging=stderr", "--v=0", "--dump-dom"],
        &page,
        &dir.path().join("profile"),
    );
    // Anything the page logs (errors, uncaught exceptions, failed loads) is a CONSOLE line.
    let console: Vec<&str> = log.lines().filter(|l| l.contains("CONSOLE")).collect();
    assert!(console.is_empty(), "console output: {console:#?}");
    // The script ran to its end: it marks the body with the number of buffer rects.
    assert!(
        dom.contains(&format!(r#"data-ready="{}""#, owned(&plan).len())),
        "script did not run: {}",
        &dom[..dom.len().min(500)]
    );
    assert_eq!(
        dom.matches(r#"<rect class="buf "#).count(),
        owned(&plan).len()
    );
}

#[test]
fn chromium_check_sees_console_errors() {
    // The check above would notice a broken page.
    if !chromium_installed() {
        return;
    }
    let dir = scratch();
    let page = dir.path().join("bad.html");
    std::fs::write(
        &page,
        "<!DOCTYPE html><html><body><script>missing();</script></body></html>",
    )
    .unwrap();
    let (_, log) = chromium(
        &["--enable-logging=stderr", "--v=0", "--dump-dom"],
        &page,
        &dir.path().join("profile"),
    );
    assert!(
        log.lines()
            .any(|l| l.contains("CONSOLE") && l.contains("missing")),
        "{log}"
    );
}
