//! Repeated structure: the model body splits into units at every point where exactly one
//! computed value is live; a run of consecutive units that are identical up to value names
//! (same ops, attributes and parameter shapes) becomes one `block` and `repeat N`.

use super::write::Weights;
use std::collections::{HashMap, HashSet};

/// One body line: the name it defines, and whether it declares a parameter.
pub(super) struct Line {
    pub text: String,
    pub defines: String,
    pub param: bool,
}

/// Identifier tokens of `text` that are not function names, with their byte ranges.
fn names(text: &str) -> Vec<(usize, usize)> {
    let bytes = text.as_bytes();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if !is_ident(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && is_ident(bytes[i]) {
            i += 1;
        }
        let number = bytes[start].is_ascii_digit() || (start > 0 && bytes[start - 1] == b'.');
        if !number && bytes.get(i) != Some(&b'(') {
            out.push((start, i));
        }
    }
    out
}

/// The names each line reads, among `known`.
fn reads(line: &Line, known: &HashSet<&str>) -> Vec<String> {
    names(&line.text)
        .into_iter()
        .map(|(a, b)| &line.text[a..b])
        .filter(|n| *n != line.defines && known.contains(n))
        .map(str::to_string)
        .collect()
}

/// `line` with names defined in its unit replaced by their order there, the unit's input
/// by `#in`: equal for lines that do the same thing.
fn canonical(line: &Line, local: &HashMap<String, usize>, input: &str) -> String {
    let mut out = String::new();
    let mut last = 0;
    for (a, b) in names(&line.text) {
        let n = &line.text[a..b];
        out += &line.text[last..a];
        match local.get(n) {
            Some(k) => out += &format!("#{k}"),
            None if n == input => out += "#in",
            None => out += n,
        }
        last = b;
    }
    out + &line.text[last..]
}

/// A unit: lines `start..end`, reading only `input` from outside, defining `output`.
struct Unit {
    start: usize,
    end: usize,
    input: String,
    output: String,
    key: String,
}

/// Splits `lines` into units at single-live-value points. `inputs` are the graph inputs;
/// `tail` the names the outputs read.
fn units(lines: &[Line], inputs: &[String], tail: &[String]) -> Vec<Unit> {
    let mut known: HashSet<&str> = lines.iter().map(|l| l.defines.as_str()).collect();
    known.extend(inputs.iter().map(String::as_str));
    let reads: Vec<Vec<String>> = lines.iter().map(|l| reads(l, &known)).collect();
    let mut last_use: HashMap<&str, usize> = HashMap::new();
    for (i, r) in reads.iter().enumerate() {
        for n in r {
            last_use.insert(n, i);
        }
    }
    for n in tail {
        last_use.insert(n, lines.len());
    }
    // Values defined before position p and read at or after it.
    let mut live: HashSet<&str> = inputs
        .iter()
        .map(String::as_str)
        .filter(|n| last_use.contains_key(n))
        .collect();
    let mut cuts = Vec::new();
    for p in 0..=lines.len() {
        if live.len() == 1 {
            let v = live.iter().next().copied().unwrap_or_default();
            let is_param = lines.iter().any(|l| l.param && l.defines == v);
            if !is_param {
                cuts.push((p, v.to_string()));
            }
        }
        if let Some(line) = lines.get(p) {
            live.retain(|n| last_use.get(n).is_some_and(|&u| u > p));
            if last_use.get(line.defines.as_str()).is_some_and(|&u| u > p) {
                live.insert(&line.defines);
            }
        }
    }
    cuts.windows(2)
        .map(|w| {
            let ((start, input), (end, output)) = (&w[0], &w[1]);
            let local: HashMap<String, usize> = lines[*start..*end]
                .iter()
                .enumerate()
                .map(|(k, l)| (l.defines.clone(), k))
                .collect();
            let key = lines[*start..*end]
                .iter()
                .map(|l| canonical(l, &local, input))
                .collect::<Vec<_>>()
                .join("\n");
            Unit {
                start: *start,
                end: *end,
                input: input.clone(),
                output: output.clone(),
                key,
            }
        })
        .collect()
}

/// The longest stretch at the start of `units` made of one sequence of units repeated
/// back to back: `(period, count)`, count 1 when nothing repeats.
fn best_run(units: &[Unit]) -> (usize, usize) {
    let mut best = (1, 1);
    for period in 1..=(units.len() / 2).min(MAX_PERIOD) {
        let mut count = 1;
        while (count + 1) * period <= units.len()
            && (0..period).all(|k| units[count * period + k].key == units[k].key)
        {
            count += 1;
        }
        if count >= 2 && period * count > best.0 * best.1 {
            best = (period, count);
        }
    }
    best
}

/// The most units one repeated block may span.
const MAX_PERIOD: usize = 32;

/// The body as text: stretches where a sequence of units repeats back to back folded into
/// `block` + `repeat` (named by `fresh`), with their weights renamed to the instances'
/// parameter names (`unit1.0.conv.weight`).
pub(super) fn fold(
    lines: &[Line],
    inputs: &[String],
    tail: &[String],
    weights: &mut Weights,
    mut fresh: impl FnMut() -> String,
) -> Vec<String> {
    let units = units(lines, inputs, tail);
    let mut out = Vec::new();
    let mut done = 0;
    let mut u = 0;
    while u < units.len() {
        let (period, count) = best_run(&units[u..]);
        // Start a block at a unit with parameters (a conv, not the previous block's relu)
        // when the run shifted by one unit is as long.
        let opens_with_param = lines[units[u].start..units[u].end].iter().any(|l| l.param);
        let shifted = !opens_with_param && best_run(&units[u + 1..]) == (period, count);
        if count < 2 || shifted {
            u += 1;
            continue;
        }
        let instances: Vec<&[Unit]> = units[u..u + period * count].chunks(period).collect();
        let span = |inst: &[Unit]| inst[0].start..inst[inst.len() - 1].end;
        let (first, last) = (instances[0], instances[count - 1]);
        out.extend(lines[done..first[0].start].iter().map(|l| l.text.clone()));
        let name = fresh();
        out.push(format!("block {name}({}) {{", first[0].input));
        out.extend(lines[span(first)].iter().map(|l| format!("  {}", l.text)));
        out.push(format!("  return {}", first[period - 1].output));
        out.push("}".to_string());
        out.push(format!(
            "let {} = repeat {count} {name}({})",
            last[period - 1].output,
            first[0].input
        ));
        let canon: Vec<&str> = lines[span(first)]
            .iter()
            .filter(|l| l.param)
            .map(|l| l.defines.as_str())
            .collect();
        let mut renames: HashMap<&str, String> = HashMap::new();
        for (j, inst) in instances.iter().enumerate() {
            let params = lines[span(inst)].iter().filter(|l| l.param);
            for (p, c) in params.zip(&canon) {
                renames.insert(&p.defines, format!("{name}.{j}.{c}"));
            }
        }
        for (w, _, _) in weights.iter_mut() {
            let (head, rest) = w.split_once('.').unwrap_or((w.as_str(), ""));
            if let Some(new) = renames.get(head) {
                *w = if rest.is_empty() {
                    new.clone()
                } else {
                    format!("{new}.{rest}")
                };
            }
        }
        done = span(last).end;
        u += period * count;
    }
    out.extend(lines[done..].iter().map(|l| l.text.clone()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(text: &str, defines: &str, param: bool) -> Line {
        Line {
            text: text.to_string(),
            defines: defines.to_string(),
            param,
        }
    }

    #[test]
    fn identical_layers_become_one_repeated_block() {
        let mut lines = Vec::new();
        for i in 1..=3 {
            lines.push(line(&format!("param w{i}: [4, 4]"), &format!("w{i}"), true));
            lines.push(line(
                &format!("let h{i} = relu(h{} @ w{i})", i - 1),
                &format!("h{i}"),
                false,
            ));
        }
        lines.push(line("let out = softmax(h3)", "out", false));
        let mut weights: Weights = (1..=3)
            .map(|i| (format!("w{i}"), vec![4, 4], vec![0.0; 16]))
            .collect();
        let mut n = 0;
        let text = fold(
            &lines,
            &["h0".to_string()],
            &["out".to_string()],
            &mut weights,
            || {
                n += 1;
                format!("unit{n}")
            },
        );
        assert_eq!(
            text,
            [
                "block unit1(h0) {",
                "  param w1: [4, 4]",
                "  let h1 = relu(h0 @ w1)",
                "  return h1",
                "}",
                "let h3 = repeat 3 unit1(h0)",
                "let out = softmax(h3)",
            ]
        );
        let names: Vec<&str> = weights.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(names, ["unit1.0.w1", "unit1.1.w1", "unit1.2.w1"]);
    }

    #[test]
    fn a_value_read_twice_later_prevents_a_cut() {
        let lines = vec![
            line("let a = relu(x)", "a", false),
            line("let b = relu(a)", "b", false),
            line("let c = relu(a)", "c", false),
            line("let d = b + c", "d", false),
        ];
        let units = units(&lines, &["x".to_string()], &["d".to_string()]);
        let spans: Vec<(usize, usize)> = units.iter().map(|u| (u.start, u.end)).collect();
        assert_eq!(spans, [(0, 1), (1, 4)]);
    }
}
