//! The HTML beside the plots of `memc viz`: the legend, the per-phase peaks, the byte
//! totals and the largest tensors live at the peak with their role and `.mdl` line.

use super::{class_name, esc, phase_name, phase_runs, source_ref};
use crate::ir::Phase;
use crate::plan::{grouped, human_bytes, BufferClass, PeakTensor, Plan};
use std::fmt::Write;

/// The legend: each class with buffers (count and bytes), the phases and the lines.
pub(super) fn legend(out: &mut String, plan: &Plan) {
    let _ = writeln!(out, r#"<div id="legend" class="legend">"#);
    for c in BufferClass::ALL {
        let (css, label) = class_name(c);
        let (count, bytes) = plan
            .buffers
            .iter()
            .filter(|b| b.view_of.is_none())
            .filter(|b| b.class == c)
            .fold((0u64, 0u64), |(n, s), b| (n + 1, s + b.bytes));
        if count == 0 {
            continue;
        }
        let _ = writeln!(
            out,
            r#"<span class="item"><svg class="swatch" viewBox="0 0 12 12"><rect class="key {css}" width="12" height="12"/></svg>{label} <small>({count} buffers, {})</small></span>"#,
            human_bytes(bytes)
        );
    }
    for p in [Phase::Forward, Phase::Backward, Phase::Update] {
        if plan.steps.iter().any(|s| s.phase == p) {
            let name = phase_name(p);
            let _ = writeln!(
                out,
                r#"<span class="item"><svg class="swatch" viewBox="0 0 12 12"><rect class="key band {name}" width="12" height="12"/></svg>{name} steps</span>"#
            );
        }
    }
    let _ = writeln!(
        out,
        r#"<span class="item"><span class="line live"></span>live bytes</span><span class="item"><span class="line peak"></span>peak</span><span class="item"><span class="line arena"></span>arena</span>"#
    );
    let _ = writeln!(out, "</div>");
}

/// The per-phase peaks, the byte totals and the largest tensors at the peak; `file` is the
/// name their `.mdl` lines are given under.
pub(super) fn tables(out: &mut String, plan: &Plan, file: &str) {
    let r = &plan.report;
    let runs = phase_runs(plan);
    let _ = writeln!(
        out,
        r#"<div class="tables"><table id="phases"><caption>peak per phase</caption><tr><th>phase</th><th>steps</th><th>peak</th><th>bytes</th></tr>"#
    );
    for p in &r.phases {
        let steps: usize = runs
            .iter()
            .filter(|run| run.0 == p.phase)
            .map(|run| run.2 - run.1 + 1)
            .sum();
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{steps}</td><td>{}</td><td>{}</td></tr>",
            phase_name(p.phase),
            human_bytes(p.peak),
            grouped(p.peak)
        );
    }
    let _ = writeln!(out, "</table>");
    let b = &r.bytes;
    let mut rows: Vec<(&str, u64)> = vec![("params", b.params)];
    if plan.train.is_some() {
        rows.push(("grads", b.grads));
        rows.push(("optimizer state", b.optimizer));
        rows.push(("saved activations", b.activations));
    }
    rows.extend([
        ("inputs", b.inputs),
        ("workspace", b.workspace),
        ("peak live", b.peak),
        ("lower bound", b.lower_bound),
        ("arena", b.arena),
        ("no reuse", b.no_reuse),
    ]);
    let _ = writeln!(
        out,
        r#"<table id="totals"><caption>byte totals</caption><tr><th>memory</th><th>size</th><th>bytes</th></tr>"#
    );
    for (name, v) in rows {
        let _ = writeln!(
            out,
            "<tr><td>{name}</td><td>{}</td><td>{}</td></tr>",
            human_bytes(v),
            grouped(v)
        );
    }
    let _ = writeln!(out, "</table>");
    peak_table(out, plan, file);
    let _ = writeln!(out, "</div>");
}

/// The largest tensors live at the peak, each row with its role and the `.mdl` line it
/// comes from (its title says the same for the hover).
fn peak_table(out: &mut String, plan: &Plan, file: &str) {
    let tensors: &[PeakTensor] = &plan.report.largest_at_peak;
    if tensors.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        r#"<table id="largest"><caption>largest tensors live at the peak</caption><tr><th>tensor</th><th>holds</th><th>size</th><th>source</th></tr>"#
    );
    for t in tensors {
        let holds = match &t.role {
            Some(r) => r.describe(t.line),
            None => class_name(t.class).1.to_string(),
        };
        let source = source_ref(plan, file, t.line).unwrap_or_default();
        let _ = writeln!(
            out,
            r#"<tr title="{}"><td>{}</td><td>{}</td><td>{}</td><td class="code">{}</td></tr>"#,
            esc(&format!("{holds}\n{source}")),
            esc(&t.name),
            esc(&holds),
            human_bytes(t.bytes),
            esc(&source)
        );
    }
    let _ = writeln!(out, "</table>");
}
