//! ONNX `Einsum` of one or two operands as `.mdl` arithmetic: letters only one operand has
//! and the output lacks are summed first; two operands then become one batched matmul,
//! `[batch, rows, contracted] @ [batch, contracted, cols]` through permutes and reshapes, and
//! the result is permuted to the output's order. A letter repeated within one operand (a
//! diagonal) and ellipses are refused.

use super::{operand, Out, R};
use crate::onnx::write::shape_text;
use crate::onnx::{Dyn, Env, Node};

/// Maps `node` when it is an `Einsum`; `None` for other ops.
pub(super) fn map(node: &Node, env: &Env, w: &mut crate::onnx::write::Writer) -> R<Option<Out>> {
    if node.op() != "Einsum" {
        return Ok(None);
    }
    let equation: String = node
        .string("equation")
        .unwrap_or_default()
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let refuse = |why: &str| {
        node.err(format!("equation `{equation}` {why}"), "memc imports Einsum of one or two operands with distinct letters per operand and no `...`")
    };
    if equation.contains("...") {
        return Err(refuse("uses an ellipsis"));
    }
    let (lhs, explicit) = match equation.split_once("->") {
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (equation.clone(), None),
    };
    let terms: Vec<Vec<char>> = lhs.split(',').map(|t| t.chars().collect()).collect();
    if terms.len() != node.p.input.len() || !(1..=2).contains(&terms.len()) {
        return Err(refuse("needs one term per operand, one or two operands"));
    }
    let distinct = |t: &[char]| t.iter().enumerate().all(|(i, c)| !t[..i].contains(c));
    if !terms
        .iter()
        .all(|t| t.iter().all(char::is_ascii_alphabetic) && distinct(t))
    {
        return Err(refuse("repeats a letter within an operand (a diagonal)"));
    }
    let all: Vec<char> = terms.concat();
    let out: Vec<char> = match explicit {
        Some(o) => o.chars().collect(),
        None => {
            // Implicit output: the letters that appear once, in alphabetical order.
            let mut once: Vec<char> = all
                .iter()
                .copied()
                .filter(|c| all.iter().filter(|d| *d == c).count() == 1)
                .collect();
            once.sort_unstable();
            once
        }
    };
    if !distinct(&out) || out.iter().any(|c| !all.contains(c)) {
        return Err(refuse("has an output letter no operand has, or twice"));
    }
    let mut xs = Vec::new();
    for (i, term) in terms.iter().enumerate() {
        let x = operand(node, env, w, i)?;
        if x.shape.len() != term.len() {
            return Err(refuse(&format!(
                "gives operand {i} {} letters for rank {}",
                term.len(),
                x.shape.len()
            )));
        }
        // Letters no other term and not the output have are summed away first.
        let keep: Vec<char> = term
            .iter()
            .copied()
            .filter(|c| {
                out.contains(c)
                    || terms
                        .iter()
                        .enumerate()
                        .any(|(j, t)| j != i && t.contains(c))
            })
            .collect();
        xs.push(summed(w, node, x, term, &keep));
    }
    let size = |c: char| {
        xs.iter()
            .find_map(|(x, t): &(Dyn, Vec<char>)| {
                t.iter().position(|d| *d == c).map(|k| x.shape[k])
            })
            .unwrap_or(1)
    };
    if let [(a, ta), (b, tb)] = &xs[..] {
        if ta.iter().any(|c| {
            tb.contains(c) && size(*c) != b.shape[tb.iter().position(|d| d == c).unwrap_or(0)]
        }) {
            return Err(refuse("gives one letter two sizes"));
        }
        let batch: Vec<char> = out
            .iter()
            .copied()
            .filter(|c| ta.contains(c) && tb.contains(c))
            .collect();
        let rows: Vec<char> = ta
            .iter()
            .copied()
            .filter(|c| out.contains(c) && !tb.contains(c))
            .collect();
        let cols: Vec<char> = tb
            .iter()
            .copied()
            .filter(|c| out.contains(c) && !ta.contains(c))
            .collect();
        let inner: Vec<char> = ta
            .iter()
            .copied()
            .filter(|c| tb.contains(c) && !out.contains(c))
            .collect();
        let prod = |cs: &[char]| cs.iter().map(|&c| size(c)).product::<usize>();
        let left = arranged(
            a,
            ta,
            &[&batch[..], &rows, &inner].concat(),
            &[prod(&batch), prod(&rows), prod(&inner)],
        );
        let right = arranged(
            b,
            tb,
            &[&batch[..], &inner, &cols].concat(),
            &[prod(&batch), prod(&inner), prod(&cols)],
        );
        let got: Vec<char> = [&batch[..], &rows, &cols].concat();
        let dims: Vec<usize> = got.iter().map(|&c| size(c)).collect();
        // A full contraction is a scalar: the sum of the `[1, 1, 1]` product.
        let product = if dims.is_empty() {
            format!("sum({left} @ {right})")
        } else {
            format!("reshape({left} @ {right}, ({}))", shape_text(&dims, &[]))
        };
        return Ok(Some(permuted(product, &got, &out, size)));
    }
    let (x, t) = &xs[0];
    Ok(Some(permuted(x.expr.clone(), t, &out, size)))
}

/// `x` (letters `term`) with the letters not in `keep` summed away: the value and its letters.
fn summed(
    w: &mut crate::onnx::write::Writer,
    node: &Node,
    x: Dyn,
    term: &[char],
    keep: &[char],
) -> (Dyn, Vec<char>) {
    let gone: Vec<String> = (0..term.len())
        .filter(|&k| !keep.contains(&term[k]))
        .map(|k| k.to_string())
        .collect();
    if gone.is_empty() {
        return (x, term.to_vec());
    }
    let shape: Vec<usize> = (0..term.len())
        .filter(|&k| keep.contains(&term[k]))
        .map(|k| x.shape[k])
        .collect();
    let base = node.p.output.first().cloned().unwrap_or_default();
    let axes = match &gone[..] {
        [one] => one.clone(),
        _ => format!("({})", gone.join(", ")),
    };
    let expr = format!("sum({}, axis = {axes})", x.expr);
    let syms = vec![None; shape.len()];
    (
        w.bind(&format!("{base}_summed"), expr, shape, syms),
        keep.to_vec(),
    )
}

/// `x` (letters `term`) permuted to `order` and reshaped to `dims`, as an expression.
fn arranged(x: &Dyn, term: &[char], order: &[char], dims: &[usize]) -> String {
    let perm: Vec<String> = order
        .iter()
        .filter_map(|c| term.iter().position(|d| d == c))
        .map(|k| k.to_string())
        .collect();
    let identity = perm.iter().enumerate().all(|(i, p)| *p == i.to_string());
    let moved = if identity {
        x.expr.clone()
    } else {
        format!("permute({}, ({}))", x.expr, perm.join(", "))
    };
    format!("reshape({moved}, ({}))", shape_text(dims, &[]))
}

/// `expr` (letters `got`) permuted to the output's letters `out`.
fn permuted(expr: String, got: &[char], out: &[char], size: impl Fn(char) -> usize) -> Out {
    let dims: Vec<usize> = out.iter().map(|&c| size(c)).collect();
    let perm: Vec<String> = out
        .iter()
        .filter_map(|c| got.iter().position(|d| d == c))
        .map(|k| k.to_string())
        .collect();
    let identity = perm.iter().enumerate().all(|(i, p)| *p == i.to_string());
    let expr = if identity || out.len() < 2 {
        expr
    } else {
        format!("permute({expr}, ({}))", perm.join(", "))
    };
    let syms = vec![None; dims.len()];
    Out::Expr(expr, dims, syms)
}
