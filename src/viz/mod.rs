//! `viz`: the arena over time as one self-contained HTML page (inline SVG, CSS and a little
//! JS; no network): every buffer a rectangle from its first to its last step and over its
//! bytes, coloured by class, with the peak and arena marked; the live bytes stacked by kind;
//! per-phase tables and the largest tensors at the peak. Every buffer and table row hovers
//! to its role and its `.mdl` line.

mod arena;
mod stacked;
mod tables;

use crate::ir::Phase;
use crate::plan::{grouped, human_bytes, BufferClass, Plan};
use std::fmt::Write;

/// Plot area in SVG user units; the SVG scales to the page width through its viewBox.
const PLOT_W: f64 = 1200.0;
const PLOT_H: f64 = 560.0;
const LEFT: f64 = 96.0;
const RIGHT: f64 = 24.0;
const TOP: f64 = 48.0;
const BOTTOM: f64 = 44.0;
/// Rectangles thinner than this (in user units) are drawn this thick so they stay visible.
const MIN_H: f64 = 0.4;

/// "FILE:LINE  text" of `.mdl` line `line` of `plan`, when the plan knows it.
fn source_ref(plan: &Plan, file: &str, line: Option<usize>) -> Option<String> {
    let n = line?;
    let text = plan.source_lines.get(&n).map_or("", String::as_str);
    Some(format!("{file}:{n}  {text}"))
}

/// The CSS class and legend label of a buffer class.
fn class_name(c: BufferClass) -> (&'static str, &'static str) {
    let css = match c {
        BufferClass::Param => "param",
        BufferClass::OptimState => "optim",
        BufferClass::Input => "input",
        BufferClass::Activation => "act",
        BufferClass::Gradient => "grad",
        BufferClass::Temporary => "temp",
        BufferClass::Workspace => "ws",
    };
    (css, c.label())
}

fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Forward => "forward",
        Phase::Backward => "backward",
        Phase::Update => "update",
    }
}

/// Escapes text for HTML element content and attribute values.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// Contiguous runs of steps in the same phase: `(phase, first, last)`.
fn phase_runs(plan: &Plan) -> Vec<(Phase, usize, usize)> {
    let mut runs: Vec<(Phase, usize, usize)> = Vec::new();
    for (i, s) in plan.steps.iter().enumerate() {
        match runs.last_mut() {
            Some(r) if r.0 == s.phase && r.2 + 1 == i => r.2 = i,
            _ => runs.push((s.phase, i, i)),
        }
    }
    runs
}

struct Scale {
    steps: f64,
    /// The bytes at the top of the plot.
    arena: f64,
}

impl Scale {
    fn x(&self, step: f64) -> f64 {
        LEFT + step / self.steps * (PLOT_W - LEFT - RIGHT)
    }
    fn y(&self, bytes: f64) -> f64 {
        TOP + (PLOT_H - TOP - BOTTOM) * (1.0 - bytes / self.arena)
    }
    fn h(&self, bytes: f64) -> f64 {
        (PLOT_H - TOP - BOTTOM) * bytes / self.arena
    }
}

/// "Nice" tick spacing for `max` over about `n` ticks: 1, 2 or 5 times a power of ten.
fn tick_step(max: f64, n: f64) -> f64 {
    if max <= 0.0 {
        return 1.0;
    }
    let raw = max / n;
    let p = 10f64.powf(raw.log10().floor());
    let m = raw / p;
    let f = if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    };
    f * p
}

/// Tick spacing for bytes: a nice step in the largest binary unit (KiB, MiB, GiB...) that
/// `max` reaches, so labels read 2.0 GiB, 4.0 GiB, ...
fn byte_tick_step(max: f64, n: f64) -> f64 {
    let mut unit = 1.0;
    while max / (unit * 1024.0) >= 1.0 && unit < 1024f64.powi(4) {
        unit *= 1024.0;
    }
    tick_step(max / unit, n) * unit
}

/// The frame around the plot area, and the end of the `<svg>`.
fn close_plot(out: &mut String) {
    let _ = writeln!(
        out,
        r#"<rect class="frame" x="{LEFT}" y="{TOP}" width="{:.2}" height="{:.2}"/>"#,
        PLOT_W - LEFT - RIGHT,
        PLOT_H - TOP - BOTTOM
    );
    let _ = writeln!(out, "</svg>");
}

/// Width of `text` at the labels' 11-unit font, with room to spare (digits and letters
/// average under 0.62 of the font size).
fn label_width(text: &str) -> f64 {
    text.chars().count() as f64 * 11.0 * 0.62
}

/// Phase bands behind everything; each phase labelled once, at its first run, where the
/// label clears the one before it (updates interleave with backward when the optimizer
/// runs in it), moved left where it would pass the chart's right edge.
fn phase_bands(out: &mut String, plan: &Plan, sc: &Scale) {
    let mut labelled: Vec<Phase> = Vec::new();
    let mut last_end = f64::NEG_INFINITY;
    let right = sc.x(plan.steps.len() as f64);
    for (phase, first, last) in phase_runs(plan) {
        let x = sc.x(first as f64);
        let w = sc.x(last as f64 + 1.0) - x;
        let name = phase_name(phase);
        let _ = write!(
            out,
            r#"<rect class="band {name}" x="{x:.2}" y="{TOP}" width="{w:.2}" height="{:.2}"><title>{name}: steps {first}..={last}</title></rect>"#,
            PLOT_H - TOP - BOTTOM,
        );
        let label = format!("{name} ▸");
        let at = (x + 2.0).min(right - label_width(&label));
        if !labelled.contains(&phase) && at >= last_end + 8.0 {
            labelled.push(phase);
            last_end = at + label_width(&label);
            let _ = write!(
                out,
                r#"<text class="bandlabel" x="{at:.2}" y="{:.2}">{label}</text>"#,
                TOP - 26.0
            );
        }
        let _ = writeln!(out);
    }
}

/// Grid lines and byte ticks up to `arena`, step ticks up to `n`, and the axis label.
fn axes(out: &mut String, sc: &Scale, n: usize, arena: u64) {
    let ystep = byte_tick_step(arena as f64, 6.0);
    let mut t = 0.0;
    while t <= arena as f64 * 1.0001 {
        let y = sc.y(t);
        let _ = writeln!(
            out,
            r#"<line class="grid" x1="{LEFT}" x2="{:.2}" y1="{y:.2}" y2="{y:.2}"/><text class="ytick" x="{:.2}" y="{:.2}">{}</text>"#,
            PLOT_W - RIGHT,
            LEFT - 6.0,
            y + 4.0,
            human_bytes(t as u64)
        );
        t += ystep;
    }
    let xstep = tick_step(n as f64, 10.0).max(1.0);
    let mut s = 0.0;
    while s <= n as f64 {
        let x = sc.x(s);
        let _ = writeln!(
            out,
            r#"<line class="axis" x1="{x:.2}" x2="{x:.2}" y1="{:.2}" y2="{:.2}"/><text class="xtick" x="{x:.2}" y="{:.2}">{}</text>"#,
            PLOT_H - BOTTOM,
            PLOT_H - BOTTOM + 5.0,
            PLOT_H - BOTTOM + 18.0,
            s as u64
        );
        s += xstep;
    }
    let _ = writeln!(
        out,
        r#"<text class="axislabel" x="{:.2}" y="{:.2}">step</text>"#,
        (LEFT + PLOT_W - RIGHT) / 2.0,
        PLOT_H - 6.0
    );
}

const CSS: &str = r#"
body { font: 13px/1.4 system-ui, sans-serif; margin: 16px; color: #222; background: #fff; }
h1 { font-size: 18px; margin: 0 0 4px; }
#summary { margin: 0 0 8px; color: #444; }
#plot, #stacked { width: 100%; height: auto; display: block; border: 1px solid #ddd; }
#stacked { margin-top: 12px; } .area { stroke: rgba(0,0,0,0.35); stroke-width: 0.3; }
.area:hover { stroke: #000; stroke-width: 1; } h2 { font-size: 15px; margin: 16px 0 4px; }
.buf { stroke: rgba(0,0,0,0.25); stroke-width: 0.15; shape-rendering: crispEdges; }
.buf:hover, .buf.hot { stroke: #000; stroke-width: 1; }
.param { fill: #4e79a7; } .optim { fill: #b07aa1; } .input { fill: #9d9d9d; }
.act { fill: #f28e2b; } .grad { fill: #e15759; } .temp { fill: #59a14f; } .ws { fill: #edc948; }
.band.forward { fill: #e9f1fa; } .band.backward { fill: #faeee5; } .band.update { fill: #e3f3e3; }
.key.band { stroke: #bbb; stroke-width: 1; }
.bandlabel, .ytick, .xtick, .axislabel, .marklabel { font-size: 11px; fill: #555; }
.ytick { text-anchor: end; } .xtick, .axislabel { text-anchor: middle; }
.marklabel { font-weight: 600; fill: #a00; }
.grid { stroke: #e4e4e4; stroke-width: 0.5; } .axis { stroke: #999; stroke-width: 0.6; }
.frame { fill: none; stroke: #999; stroke-width: 0.6; }
.live { fill: none; stroke: #222; stroke-width: 0.8; pointer-events: none; }
.mark { stroke-width: 1.2; stroke-dasharray: 5 3; pointer-events: none; }
.mark.peak { stroke: #c00; } .mark.arena { stroke: #000; }
.legend { margin: 8px 0; } .legend .item { margin-right: 16px; white-space: nowrap; }
.swatch { width: 12px; height: 12px; vertical-align: -1px; margin-right: 4px; }
.line { display: inline-block; width: 18px; height: 0; vertical-align: middle; margin-right: 4px; }
.line.live { border-top: 2px solid #222; } .line.peak { border-top: 2px dashed #c00; }
.line.arena { border-top: 2px dashed #000; }
.tables { display: flex; gap: 32px; flex-wrap: wrap; align-items: flex-start; }
table { border-collapse: collapse; margin-top: 8px; }
caption { text-align: left; font-weight: 600; padding-bottom: 4px; }
td, th { padding: 2px 10px; border-bottom: 1px solid #eee; text-align: right; }
td:first-child, th:first-child, td.code { text-align: left; }
td.code { font: 12px ui-monospace, monospace; }
#tip { position: fixed; display: none; pointer-events: none; background: #fffff4;
  border: 1px solid #888; padding: 4px 8px; white-space: pre; font: 12px ui-monospace, monospace;
  box-shadow: 0 1px 4px rgba(0,0,0,0.2); z-index: 10; }
"#;

/// Shows the hover text of a buffer, a stacked area or a row of the largest tensors (their
/// `<title>` or `title`, which still work without script) in a tooltip that follows the mouse.
const JS: &str = r#"
(function () {
  var tip = document.getElementById('tip');
  var plot = document.getElementById('plot');
  if (!tip || !plot) { return; }
  var hovered = 'rect.buf, polygon.area, #largest tr[title], #largest tr[data-tip]';
  function text(t) {
    if (!t.hasAttribute('data-tip')) {
      var title = t.querySelector('title');
      if (title) { t.setAttribute('data-tip', title.textContent); title.remove(); }
      else { t.setAttribute('data-tip', t.getAttribute('title') || ''); t.removeAttribute('title'); }
    }
    return t.getAttribute('data-tip');
  }
  document.addEventListener('mouseover', function (e) {
    var t = e.target.closest ? e.target.closest(hovered) : null;
    if (!t) { tip.style.display = 'none'; return; }
    tip.textContent = text(t);
    tip.style.display = 'block';
  });
  document.addEventListener('mousemove', function (e) {
    if (tip.style.display !== 'block') { return; }
    var x = e.clientX + 14, y = e.clientY + 14;
    var r = tip.getBoundingClientRect();
    if (x + r.width > window.innerWidth) { x = e.clientX - r.width - 8; }
    if (y + r.height > window.innerHeight) { y = e.clientY - r.height - 8; }
    tip.style.left = x + 'px';
    tip.style.top = y + 'px';
  });
  document.body.setAttribute('data-ready', String(plot.querySelectorAll('rect.buf').length));
})();
"#;

/// The page: a title and summary line, the legend, the SVG plot (one `<rect class="buf ...">`
/// per buffer, x over `[first, last + 1)` steps and y over `[offset, offset + bytes)` on a
/// linear byte scale from 0 to the arena), the live bytes stacked by kind, the per-phase
/// peak table, the byte totals and the largest tensors at the peak. Each buffer's hover
/// text names its role and its `.mdl` line as `FILE:LINE` with the line's text, `file`
/// being the name given. No external resources: the page works offline.
pub fn render_html(plan: &Plan, file: &str) -> String {
    let live = plan.live_per_step();
    let r = &plan.report;
    let kind = if plan.train.is_some() {
        "training step"
    } else {
        "inference step"
    };
    let mut out = String::with_capacity(400 * plan.buffers.len() + 16_384);
    let _ = writeln!(
        out,
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>memc: {} memory</title>
<style>{CSS}</style></head>
<body>
<h1>{} ({kind}): arena over time</h1>"#,
        esc(&plan.model),
        esc(&plan.model)
    );
    let _ = writeln!(
        out,
        r#"<p id="summary">{} buffers ({} views of others), {} steps · arena {} ({} bytes) · peak live {} ({} bytes) · lower bound {} · no reuse {}{}. Each rectangle is a buffer over the steps it is live (x) and the bytes it occupies in the arena (y); hover for details.</p>"#,
        plan.buffers.len(),
        plan.buffers.iter().filter(|b| b.view_of.is_some()).count(),
        plan.steps.len(),
        human_bytes(plan.arena_bytes),
        grouped(plan.arena_bytes),
        human_bytes(r.bytes.peak),
        grouped(r.bytes.peak),
        human_bytes(r.bytes.lower_bound),
        human_bytes(r.bytes.no_reuse),
        if r.layout_optimal {
            " (layout optimal)"
        } else {
            ""
        }
    );
    if plan.host_bytes > 0 {
        let _ = writeln!(
            out,
            r#"<p id="host">Beside it, a host arena of {} ({} bytes) holds what is offloaded (its buffers are not drawn here); see the report's host lines.</p>"#,
            human_bytes(plan.host_bytes),
            grouped(plan.host_bytes),
        );
    }
    tables::legend(&mut out, plan);
    arena::svg(&mut out, plan, file, &live);
    stacked::svg(&mut out, plan, file, &live);
    tables::tables(&mut out, plan, file);
    let _ = writeln!(
        out,
        r#"<div id="tip"></div>
<script>{JS}</script>
</body></html>"#
    );
    out
}
