//! The largest tensors live at the step's peak, each with the `.mdl` line that made it: what
//! a person reads first to see what takes the memory.

use super::{human_bytes, Buffer, BufferClass, Plan, Role};
use crate::ir::Span;
use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// One buffer live at the peak.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeakTensor {
    /// The buffer's name in the plan.
    pub name: String,
    /// What it holds.
    pub class: BufferClass,
    /// Its part in the step (as [`Buffer::role`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<super::Role>,
    pub bytes: u64,
    /// 1-based line of the `.mdl` expression that made it (for backward and update values,
    /// the forward expression they belong to), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
    /// That line's text, trimmed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
}

/// The `count` largest buffers (views aside, largest first, then by id) live at the first step
/// where the live bytes peak, with the line of `source` each buffer's span falls on.
pub fn largest_at_peak(plan: &Plan, source: &str, count: usize) -> Vec<PeakTensor> {
    let mut at_peak = live_at_peak(plan);
    at_peak.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.id.0.cmp(&b.id.0)));
    at_peak
        .into_iter()
        .take(count)
        .map(|b| {
            let line = b.span.and_then(|s| line_of(source, s));
            PeakTensor {
                name: b.name.clone(),
                class: b.class,
                role: b.role.clone(),
                bytes: b.bytes,
                line: line.map(|(n, _)| n),
                code: line.map(|(_, text)| text.to_string()),
            }
        })
        .collect()
}

/// The device buffers (views aside, none empty) live at the first step where the live bytes
/// peak.
pub(super) fn live_at_peak(plan: &Plan) -> Vec<&Buffer> {
    let Some(peak) = plan
        .live_per_step()
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(&a.0)))
        .map(|(s, _)| s)
    else {
        return Vec::new();
    };
    plan.buffers
        .iter()
        .filter(|b| b.view_of.is_none() && b.tier.is_device() && b.first <= peak)
        .filter(|b| peak <= b.last && b.bytes > 0)
        .collect()
}

/// The 1-based line number and trimmed text of the line where `span` starts, when `span`
/// lies inside `source`.
pub(super) fn line_of(source: &str, span: Span) -> Option<(usize, &str)> {
    let start = span.start;
    if start >= source.len() || !source.is_char_boundary(start) {
        return None;
    }
    let number = source[..start].matches('\n').count() + 1;
    let text = source.lines().nth(number - 1)?.trim();
    Some((number, text))
}

/// The report's table of the tensors live at the peak.
pub(super) fn render(out: &mut String, tensors: &[PeakTensor]) {
    if tensors.is_empty() {
        return;
    }
    let _ = writeln!(out, "  largest tensors live at the peak:");
    for t in tensors {
        let origin = match (&t.line, &t.code) {
            (Some(n), Some(code)) => format!("line {n}: {}", clipped(code, 60)),
            _ => String::new(),
        };
        // The line follows on the row; a value made inside a block names its instance.
        let mut what = super::origin::holding(t.role.as_ref(), &t.name, t.class, None);
        if let (Some((instance, _)), false) = (
            t.name.split_once('/'),
            matches!(
                t.role,
                Some(Role::Parameter | Role::RunningStatistic | Role::Input)
            ),
        ) {
            what = format!("{what} in {instance}");
        }
        let _ = writeln!(
            out,
            "    {:<48} {:>12}  {origin}",
            clipped(&what, 48),
            human_bytes(t.bytes)
        );
    }
}

/// `text` cut to at most `width` characters, with `...` when cut.
pub(super) fn clipped(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let cut: String = text.chars().take(width.saturating_sub(3)).collect();
    format!("{cut}...")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_found_by_span_start() {
        let src = "model m {\n  dim B = 2\n  loss = mean(x)\n}\n";
        let at = src.find("mean").unwrap_or(0);
        let span = Span {
            start: at,
            end: at + 4,
        };
        assert_eq!(line_of(src, span), Some((3, "loss = mean(x)")));
        let outside = Span {
            start: src.len(),
            end: src.len() + 1,
        };
        assert_eq!(line_of(src, outside), None);
    }

    #[test]
    fn long_names_are_clipped() {
        assert_eq!(clipped("abcdef", 5), "ab...");
        assert_eq!(clipped("abc", 5), "abc");
    }
}
