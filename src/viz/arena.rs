//! The arena view of `memc viz`: every buffer a rectangle over the steps it is live (x) and
//! the bytes it occupies in the arena (y), hovering to its role and `.mdl` line; the live
//! bytes as a step line; the arena and peak marked, their label above the plot area.

use super::{
    axes, class_name, close_plot, esc, label_width, phase_bands, phase_name, source_ref, Scale,
    LEFT, MIN_H, PLOT_H, PLOT_W, RIGHT, TOP,
};
use crate::plan::{grouped, human_bytes, Buffer, Plan};
use std::fmt::Write;

/// The step that writes each buffer, as "matmul at step 31 (forward, in layer.0)"; empty
/// for buffers bound from outside (parameters, optimizer state, inputs).
fn writers(plan: &Plan) -> Vec<String> {
    let mut out = vec![String::new(); plan.buffers.len()];
    for (i, s) in plan.steps.iter().enumerate() {
        let scope = if s.scope.is_empty() {
            String::new()
        } else {
            format!(", in {}", s.scope)
        };
        let at = format!(
            "{} at step {i} ({}{scope})",
            s.op.name(),
            phase_name(s.phase)
        );
        for b in [s.output, s.workspace].into_iter().flatten() {
            if let Some(o) = out.get_mut(b.index()) {
                o.clone_from(&at);
            }
        }
    }
    out
}

/// The hover text of buffer `b`: what it holds, its source line, the step writing it, its
/// bytes and type, its offset and lifetime.
fn hover(plan: &Plan, file: &str, b: &Buffer, writer: &str) -> String {
    let mut lines = vec![b.describe()];
    lines.extend(source_ref(plan, file, b.line));
    if !writer.is_empty() {
        lines.push(format!("written by {writer}"));
    }
    lines.push(format!(
        "{} bytes ({}) · {} · {}",
        grouped(b.bytes),
        human_bytes(b.bytes),
        b.ty,
        class_name(b.class).1
    ));
    lines.push(format!(
        "offset {} · steps {}..={} · {}",
        grouped(b.offset),
        b.first,
        b.last,
        b.id
    ));
    lines.join("\n")
}

fn buffer_rect(out: &mut String, b: &Buffer, tip: &str, sc: &Scale) {
    let x = sc.x(b.first as f64);
    let w = sc.x(b.last as f64 + 1.0) - x;
    let y = sc.y((b.offset + b.bytes) as f64);
    let h = sc.h(b.bytes as f64).max(MIN_H);
    let (css, _) = class_name(b.class);
    let _ = writeln!(
        out,
        r#"<rect class="buf {css}" x="{x:.2}" y="{y:.3}" width="{w:.2}" height="{h:.3}" data-i="{}"><title>{}</title></rect>"#,
        b.id.0,
        esc(tip),
    );
}

/// The plot: phase bands, axes, one rectangle per buffer, the live-bytes line and the
/// arena and peak marks; `file` is the name hover texts give the `.mdl` lines.
pub(super) fn svg(out: &mut String, plan: &Plan, file: &str, live: &[u64]) {
    let n = plan.steps.len().max(1);
    let arena = plan.arena_bytes.max(plan.report.bytes.peak).max(1);
    let sc = Scale {
        steps: n as f64,
        arena: arena as f64,
    };
    let _ = writeln!(
        out,
        r#"<svg id="plot" viewBox="0 0 {PLOT_W} {PLOT_H}" role="img" aria-label="arena over time">"#
    );
    phase_bands(out, plan, &sc);
    axes(out, &sc, n, arena);
    let writers = writers(plan);
    let _ = writeln!(out, r#"<g id="buffers">"#);
    for (b, w) in plan.buffers.iter().zip(&writers) {
        // Views draw nothing of their own; the host arena is not the device arena drawn.
        if b.view_of.is_none() && b.tier.is_device() {
            buffer_rect(out, b, &hover(plan, file, b, w), &sc);
        }
    }
    let _ = writeln!(out, "</g>");
    // Live bytes over time as a step line.
    let mut pts = String::new();
    for (i, &v) in live.iter().enumerate() {
        let y = sc.y(v as f64);
        let _ = write!(
            pts,
            "{:.2},{y:.2} {:.2},{y:.2} ",
            sc.x(i as f64),
            sc.x(i as f64 + 1.0)
        );
    }
    let _ = writeln!(
        out,
        r#"<polyline class="live" points="{}"><title>live bytes per step</title></polyline>"#,
        pts.trim_end()
    );
    marks(out, plan, live, &sc);
    close_plot(out);
}

/// The arena and peak lines, a tick from the peak's step up to the label, and one label
/// for both in the row between the phase names and the plot area, where nothing else is
/// drawn: starting at the peak's step, or ending there when it would pass the right edge.
fn marks(out: &mut String, plan: &Plan, live: &[u64], sc: &Scale) {
    let peak = plan.report.bytes.peak;
    let peak_step = live
        .iter()
        .enumerate()
        .max_by_key(|&(i, &v)| (v, std::cmp::Reverse(i)))
        .map_or(0, |(i, _)| i);
    let py = sc.y(peak as f64);
    let ay = sc.y(plan.arena_bytes as f64);
    let px = sc.x(peak_step as f64 + 0.5);
    let text = format!(
        "peak {} at step {peak_step} · arena {}",
        human_bytes(peak),
        human_bytes(plan.arena_bytes)
    );
    // The triangle over the peak's step, the text running away from the right edge.
    let (label, lx, anchor) = if px + label_width(&text) + 12.0 <= PLOT_W - RIGHT {
        (format!("▼ {text}"), px - 5.0, "start")
    } else {
        (format!("{text} ▼"), px + 5.0, "end")
    };
    let _ = writeln!(
        out,
        r#"<line id="arena-line" class="mark arena" x1="{LEFT}" x2="{:.2}" y1="{ay:.2}" y2="{ay:.2}"><title>arena {} bytes</title></line>
<line id="peak-line" class="mark peak" x1="{LEFT}" x2="{:.2}" y1="{py:.2}" y2="{py:.2}"><title>peak live {} bytes at step {peak_step}</title></line>
<line class="mark peak" x1="{px:.2}" x2="{px:.2}" y1="{:.2}" y2="{:.2}"/>
<text id="peak-label" class="marklabel" x="{lx:.2}" y="{:.2}" text-anchor="{anchor}">{}</text>"#,
        PLOT_W - RIGHT,
        grouped(plan.arena_bytes),
        PLOT_W - RIGHT,
        grouped(peak),
        TOP - 4.0,
        PLOT_H - super::BOTTOM,
        TOP - 7.0,
        esc(&label),
    );
}
