//! The stacked view of `memc viz`: the bytes live at each step by kind (parameters,
//! optimizer state, inputs, saved activations, gradients, temporaries, workspace), stacked
//! from zero up to the live total, so that what takes the memory at the peak, and when each
//! kind grows, reads off one chart. Each area's title says its largest and its peak bytes
//! and the `.mdl` lines that hold most of them at the peak.

use super::{
    axes, class_name, close_plot, esc, phase_bands, source_ref, Scale, BOTTOM, PLOT_H, PLOT_W, TOP,
};
use crate::plan::{human_bytes, BufferClass, Plan};
use std::fmt::Write;

/// A kind with live bytes at a step is drawn at least this thick (in user units) there, so
/// that every kind stays visible beside gigabytes of others.
const MIN_BAND: f64 = 2.0;

/// The lines of `file` holding the most bytes of `class` live at step `at`, up to three, as
/// "FILE:LINE  text: 1.1 GiB in 12 buffers".
fn top_lines(plan: &Plan, file: &str, class: BufferClass, at: usize) -> Vec<String> {
    plan.bytes_by_line(|b| b.class == class && b.first <= at && at <= b.last)
        .into_iter()
        .take(3)
        .map(|(line, bytes, count)| {
            let at = source_ref(plan, file, line).unwrap_or_else(|| "no source line".into());
            let s = if count == 1 { "" } else { "s" };
            format!("  {at}: {} in {count} buffer{s}", human_bytes(bytes))
        })
        .collect()
}

/// Writes the heading and the `<svg id="stacked">` chart: one `<polygon class="area CLASS">`
/// per kind with live bytes, in legend order from the bottom, over the same steps as the
/// arena view; `live` is the plan's live bytes per step (the top of the stack). A kind is
/// drawn at least [`MIN_BAND`] thick where it has bytes, the scale leaving room above the
/// peak for that.
pub(super) fn svg(out: &mut String, plan: &Plan, file: &str, live: &[u64]) {
    let n = live.len().max(1);
    let top = live.iter().copied().max().unwrap_or(0).max(1);
    let peak_step = live.iter().position(|&v| v == top).unwrap_or(0);
    let height = PLOT_H - TOP - BOTTOM;
    let extra = BufferClass::ALL.len() as f64 * MIN_BAND;
    let sc = Scale {
        steps: n as f64,
        arena: top as f64 * height / (height - extra),
    };
    let _ = writeln!(
        out,
        r#"<h2>Live bytes by kind</h2>
<p class="note">The same steps, each kind's live bytes stacked from zero: the top edge is the live total (its highest point, {} at step {peak_step}, is the peak the arena must hold). Hover an area for its figures.</p>
<svg id="stacked" viewBox="0 0 {PLOT_W} {PLOT_H}" role="img" aria-label="live bytes by kind over time">"#,
        human_bytes(top)
    );
    phase_bands(out, plan, &sc);
    axes(out, &sc, n, top);
    // The y of each step's stack so far.
    let mut below = vec![sc.y(0.0); n];
    for class in BufferClass::ALL {
        let own = plan.live_per_step_of(|b| b.class == class);
        let most = own.iter().copied().max().unwrap_or(0);
        if most == 0 {
            continue;
        }
        let mut upper = String::new();
        let mut lower = String::new();
        for i in 0..n {
            let (x0, x1) = (sc.x(i as f64), sc.x(i as f64 + 1.0));
            let yb = below[i];
            let y = match own[i] {
                0 => yb,
                v => yb - sc.h(v as f64).max(MIN_BAND),
            };
            let _ = write!(upper, "{x0:.2},{y:.2} {x1:.2},{y:.2} ");
            let _ = write!(lower, "{x1:.2},{yb:.2} {x0:.2},{yb:.2} ");
            below[i] = y;
        }
        // The lower edge runs back from right to left, closing the area.
        let lower: Vec<&str> = lower.split_whitespace().collect();
        let lower: Vec<&str> = lower
            .chunks(2)
            .rev()
            .flat_map(|p| p.iter().copied())
            .collect();
        let (css, label) = class_name(class);
        let mut title = format!(
            "{label}: up to {} live; {} at the peak (step {peak_step})",
            human_bytes(most),
            human_bytes(own[peak_step]),
        );
        for line in top_lines(plan, file, class, peak_step) {
            let _ = write!(title, "\n{line}");
        }
        let _ = writeln!(
            out,
            r#"<polygon class="area {css}" points="{}{}"><title>{}</title></polygon>"#,
            upper,
            lower.join(" "),
            esc(&title),
        );
    }
    close_plot(out);
}
