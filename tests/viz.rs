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
    let html = memc::viz::render_html(&plan, "mlp.mdl");
    check_page(&plan, &html);
}

/// An offloaded plan's page draws the device buffers alone and states the host arena's
/// exact bytes beside it.
#[test]
fn offloaded_page_states_the_host_arena() {
    let opts = Options {
        offload: Some(memc::settings::Offload::Optimizer),
        layout_time: Duration::ZERO,
        ..Options::default()
    };
    let plan = compile(&example("mlp.mdl"), &opts)
        .unwrap()
        .plan
        .plan()
        .clone();
    assert!(plan.host_bytes > 0);
    let html = memc::viz::render_html(&plan, "mlp.mdl");
    let device = owned(&plan)
        .iter()
        .filter(|b| b.tier == memc::plan::Tier::Device)
        .count();
    assert_eq!(html.matches(r#"<rect class="buf "#).count(), device);
    assert!(device < owned(&plan).len());
    let plain = memc::viz::render_html(&plan_of(&example("mlp.mdl"), &[]), "mlp.mdl");
    assert!(!plain.contains(r#"id="host""#));
    let host = html
        .split(r#"<p id="host">"#)
        .nth(1)
        .and_then(|rest| rest.split("</p>").next())
        .unwrap();
    let bytes = plan.host_bytes.to_string();
    let digits: String = host.chars().filter(char::is_ascii_digit).collect();
    assert!(digits.contains(&bytes), "{host}");
}

#[test]
fn gpt2_page_renders_every_buffer() {
    let plan = plan_of(&example("gpt2.mdl"), &[]);
    // Nearly a thousand buffers (983), the page at a real model's size.
    assert!(plan.buffers.len() > 900);
    let html = memc::viz::render_html(&plan, "gpt2.mdl");
    check_page(&plan, &html);
    assert!(html.len() < 4 << 20, "{} bytes", html.len());
    // The table of the largest tensors at the peak names the loss head's source line.
    assert!(html.contains(r#"<table id="largest">"#));
    assert!(
        html.contains(
            "gpt2.mdl:26  loss = cross_entropy(layernorm(x, lnf) @ transpose(wte), targets)"
        ),
        "no loss head row"
    );
}

#[test]
fn inference_page() {
    let src = "model m {\n  dim N = 4\n  input x: [N, 8]\n  param w: linear(8, 4)\n  output y = relu(linear(x, w))\n}\n";
    let plan = plan_of(src, &[]);
    assert!(plan.train.is_none());
    let html = memc::viz::render_html(&plan, "m.mdl");
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
    let html = memc::viz::render_html(&plan, "gpt2.mdl");
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

/// `text` with the five entities the page escapes turned back into characters.
fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

/// The hover text of each buffer rectangle of `html`, by buffer id.
fn hover_texts(html: &str) -> Vec<(u32, String)> {
    html.split(r#"<rect class="buf "#)
        .skip(1)
        .map(|r| {
            let id = r.split(r#"data-i=""#).nth(1).unwrap();
            let id = id[..id.find('"').unwrap()].parse().unwrap();
            let title = r.split("<title>").nth(1).unwrap();
            (id, unescape(&title[..title.find("</title>").unwrap()]))
        })
        .collect()
}

#[test]
fn every_buffer_hovers_to_its_role_and_source_line() {
    let plan = plan_of(
        &example("gpt2.mdl"),
        &[("L", 2), ("D", 64), ("T", 32), ("V", 256), ("H", 4)],
    );
    let html = memc::viz::render_html(&plan, "gpt2.mdl");
    let texts = hover_texts(&html);
    assert_eq!(texts.len(), owned(&plan).len());
    for (id, text) in &texts {
        let b = &plan.buffers[*id as usize];
        let mut lines = text.lines();
        // The first line says what the buffer holds, not its internal name.
        assert_eq!(lines.next(), Some(b.describe().as_str()), "{}", b.name);
        assert!(!text.contains('%'), "an internal value name: {text}");
        // Every buffer comes from a line.
        let line = b.line.unwrap_or_else(|| panic!("{} has no line", b.name));
        let want = format!("gpt2.mdl:{line}  {}", plan.source_lines[&line]);
        assert_eq!(lines.next(), Some(want.as_str()), "{}", b.name);
    }
    let joined: Vec<&str> = texts.iter().map(|(_, t)| t.as_str()).collect();
    let has = |prefix: &str, line: &str| {
        joined
            .iter()
            .any(|t| t.starts_with(prefix) && t.contains(line))
    };
    assert!(has("parameter `wte`", "gpt2.mdl:6  param  wte"));
    assert!(has("gradient of `wte`", "gpt2.mdl:"));
    assert!(has("Adam moment of `wte`", "gpt2.mdl:6  param  wte"));
    assert!(has(
        "activation saved for the backward of line 19",
        "gpt2.mdl:19  x = x + mlp("
    ));
    assert!(has("recomputed copy (checkpointing) of line", "gpt2.mdl:"));
    assert!(has("backward temporary of line 26", "gpt2.mdl:26  loss ="));
    assert!(has("input `tokens`", "gpt2.mdl:4"));
    // The rows of the largest tensors hover to their role and line too.
    let rows: Vec<&str> = html.split(r#"<tr title=""#).skip(1).collect();
    assert_eq!(rows.len(), plan.report.largest_at_peak.len());
    for (row, t) in rows.iter().zip(&plan.report.largest_at_peak) {
        let role = t.role.as_ref().unwrap().describe(t.line);
        let line = t.line.unwrap();
        let want = format!("{role}\ngpt2.mdl:{line}  {}", plan.source_lines[&line]);
        assert_eq!(unescape(&row[..row.find('"').unwrap()]), want);
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
    assert_eq!(html, memc::viz::render_html(&plan, "mlp.mdl"));
}

/// Whether `/usr/bin/chromium` exists; prints SKIP when it does not, or fails under
/// MEMC_REQUIRE_CHROMIUM=1 (which scripts/test sets).
fn chromium_installed() -> bool {
    let installed = Path::new("/usr/bin/chromium").exists();
    if !installed {
        if std::env::var("MEMC_REQUIRE_CHROMIUM").as_deref() == Ok("1") {
            panic!("/usr/bin/chromium not found but MEMC_REQUIRE_CHROMIUM=1; run scripts/test to install it");
        }
        eprintln!("SKIP: /usr/bin/chromium not installed");
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
    std::fs::write(&page, memc::viz::render_html(&plan, "gpt2.mdl")).unwrap();
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

/// Appended to the page by the layout test: writes into `<pre id="layout">`, as JSON, the
/// box of every visible label (SVG text and legend items, with its SVG's box), the arena
/// plot's frame, and each stacked area's thickest part in CSS pixels (its points run along
/// the top edge step by step, then back along the bottom edge, so point `i` and point
/// `n - 1 - i` bound the same step).
const MEASURE: &str = r#"<script>
(function () {
  function box(e) { var r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; }
  var labels = [];
  document.querySelectorAll('svg text, #legend .item').forEach(function (e) {
    var b = box(e), svg = e.closest('svg');
    if (b[2] > b[0] && b[3] > b[1]) {
      labels.push({text: e.textContent, id: e.id, box: b, within: svg ? box(svg) : null});
    }
  });
  var areas = [];
  document.querySelectorAll('#stacked polygon.area').forEach(function (p) {
    var pts = p.points, n = pts.numberOfItems, most = 0;
    for (var i = 0; i < n / 2; i++) {
      most = Math.max(most, pts.getItem(n - 1 - i).y - pts.getItem(i).y);
    }
    areas.push({kind: p.getAttribute('class').split(' ')[1], px: most * p.getScreenCTM().d});
  });
  var pre = document.createElement('pre');
  pre.id = 'layout';
  pre.textContent = JSON.stringify({
    labels: labels, areas: areas, frame: box(document.querySelector('#plot rect.frame'))
  });
  document.body.appendChild(pre);
})();
</script>"#;

/// Whether boxes `[left, top, right, bottom]` share more than half a pixel both ways.
fn overlap(a: &[f64], b: &[f64]) -> bool {
    a[0].max(b[0]) + 0.5 < a[2].min(b[2]) && a[1].max(b[1]) + 0.5 < a[3].min(b[3])
}

fn floats(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// Renders the example `name` in headless Chromium, saves its screenshot as
/// `target/tmp/viz/NAME.png` and checks the layout: no two labels overlap, every label lies
/// inside its chart, the peak's label stays above the plot area, and every kind with bytes
/// has an area in the stacked view at least a pixel thick.
fn check_layout(name: &str) {
    if !chromium_installed() {
        return;
    }
    let start = Instant::now();
    let plan = plan_of(&example(&format!("{name}.mdl")), &[]);
    let dir = scratch();
    let page = dir.path().join(format!("{name}.html"));
    let html = memc::viz::render_html(&plan, &format!("{name}.mdl"));
    let html = html.replace("</body>", &format!("{MEASURE}</body>"));
    std::fs::write(&page, html).unwrap();
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("viz");
    std::fs::create_dir_all(&shots).unwrap();
    let shot = shots.join(format!("{name}.png"));
    let (dom, _) = chromium(
        &[
            "--window-size=1400,1800",
            "--hide-scrollbars",
            &format!("--screenshot={}", shot.display()),
            "--dump-dom",
        ],
        &page,
        &dir.path().join("profile"),
    );
    assert!(shot.exists(), "{name}: no screenshot");
    let json = dom
        .split(r#"<pre id="layout">"#)
        .nth(1)
        .and_then(|s| s.split("</pre>").next())
        .unwrap_or_else(|| panic!("{name}: the measuring script did not run"));
    let layout: serde_json::Value = serde_json::from_str(&unescape(json)).unwrap();
    let labels = layout["labels"].as_array().unwrap();
    assert!(labels.len() > 20, "{name}: {} labels", labels.len());
    let text = |l: &serde_json::Value| l["text"].as_str().unwrap().to_string();
    for (i, a) in labels.iter().enumerate() {
        let ab = floats(&a["box"]);
        if !a["within"].is_null() {
            let w = floats(&a["within"]);
            let inside = ab[0] >= w[0] && ab[1] >= w[1] && ab[2] <= w[2] && ab[3] <= w[3];
            assert!(
                inside,
                "{name}: {:?} leaves its chart: {ab:?} in {w:?}",
                text(a)
            );
        }
        for b in &labels[i + 1..] {
            let bb = floats(&b["box"]);
            assert!(
                !overlap(&ab, &bb),
                "{name}: {:?} {ab:?} overlaps {:?} {bb:?}",
                text(a),
                text(b)
            );
        }
    }
    let peak = labels.iter().find(|l| l["id"] == "peak-label");
    let peak = floats(&peak.unwrap_or_else(|| panic!("{name}: no peak label"))["box"]);
    let frame = floats(&layout["frame"]);
    assert!(
        peak[3] <= frame[1],
        "{name}: the peak label {peak:?} is over the plot {frame:?}"
    );
    let areas: Vec<(String, f64)> = (layout["areas"].as_array().unwrap().iter())
        .map(|a| {
            (
                a["kind"].as_str().unwrap().into(),
                a["px"].as_f64().unwrap(),
            )
        })
        .collect();
    let with_bytes = BufferClass::ALL
        .iter()
        .filter(|&&c| {
            plan.live_per_step_of(|b| b.class == c)
                .iter()
                .any(|&v| v > 0)
        })
        .count();
    assert_eq!(areas.len(), with_bytes, "{name}: {areas:?}");
    for (kind, px) in &areas {
        assert!(
            *px >= 1.0,
            "{name}: the {kind} area is {px:.2} px thick at most"
        );
    }
    eprintln!(
        "{name}: layout checked in {:.1} s, screenshot {}",
        start.elapsed().as_secs_f64(),
        shot.display()
    );
}

#[test]
fn chromium_layout_gpt2() {
    check_layout("gpt2");
}

#[test]
fn chromium_layout_llama7b() {
    check_layout("llama7b");
}

#[test]
fn chromium_layout_resnet18() {
    check_layout("resnet18");
}

#[test]
fn chromium_layout_unet() {
    check_layout("unet");
}
