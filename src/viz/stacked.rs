//! The stacked view of `memc viz`: the bytes live at each step by kind (parameters,
//! optimizer state, inputs, saved activations, gradients, temporaries, workspace), stacked
//! from zero up to the live total, so that what takes the memory at the peak, and when each
//! kind grows, reads off one chart. Each area's title says its largest and its peak bytes.

use super::{axes, class_name, close_plot, esc, phase_bands, Scale, PLOT_H, PLOT_W};
use crate::plan::{human_bytes, BufferClass, Plan};
use std::fmt::Write;

/// Writes the heading and the `<svg id="stacked">` chart: one `<polygon class="area CLASS">`
/// per kind with live bytes, in legend order from the bottom, over the same steps as the
/// arena view; `live` is the plan's live bytes per step (the top of the stack).
pub(super) fn svg(out: &mut String, plan: &Plan, live: &[u64]) {
    let n = live.len().max(1);
    let top = live.iter().copied().max().unwrap_or(0).max(1);
    let peak_step = live.iter().position(|&v| v == top).unwrap_or(0);
    let sc = Scale {
        steps: n as f64,
        arena: top as f64,
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
    let mut below = vec![0u64; n];
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
            let y = sc.y((below[i] + own[i]) as f64);
            let _ = write!(upper, "{x0:.2},{y:.2} {x1:.2},{y:.2} ");
            let yb = sc.y(below[i] as f64);
            let _ = write!(lower, "{x1:.2},{yb:.2} {x0:.2},{yb:.2} ");
        }
        // The lower edge runs back from right to left, closing the area.
        let lower: Vec<&str> = lower.split_whitespace().collect();
        let lower: Vec<&str> = lower
            .chunks(2)
            .rev()
            .flat_map(|p| p.iter().copied())
            .collect();
        let (css, label) = class_name(class);
        let _ = writeln!(
            out,
            r#"<polygon class="area {css}" points="{}{}"><title>{}: up to {} live; {} at the peak (step {peak_step})</title></polygon>"#,
            upper,
            lower.join(" "),
            esc(label),
            human_bytes(most),
            human_bytes(own[peak_step]),
        );
        for (b, o) in below.iter_mut().zip(&own) {
            *b += o;
        }
    }
    close_plot(out);
}
