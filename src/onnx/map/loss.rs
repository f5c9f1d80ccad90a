//! `NegativeLogLikelihoodLoss` and `SoftmaxCrossEntropyLoss` as `.mdl` arithmetic: the
//! targets pick their class through an embedding lookup of a constant one-hot table (the
//! ignored class's row all zeros), so each element's loss is `-x[n, t, d...] * w[t]` with
//! the picked element selected by `where` (no product with the other classes), and the
//! reductions are ONNX's: none, the sum, or the sum over the sum of the picked weights.

use super::{operand, tuple_text, Out, R};
use crate::onnx::tensor::{Const, Data};
use crate::onnx::write::Writer;
use crate::onnx::{Dyn, Env, Node, Value};

/// The ONNX ops this file maps.
pub(super) const OPS: &[&str] = &["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"];

/// Maps `node` when it is one of [`OPS`]; `None` for other ops.
pub(super) fn map(node: &Node, env: &Env, w: &mut Writer) -> R<Option<Out>> {
    match node.op() {
        "NegativeLogLikelihoodLoss" => nll(node, env, w, false).map(Some),
        "SoftmaxCrossEntropyLoss" => nll(node, env, w, true).map(Some),
        _ => Ok(None),
    }
}

/// The loss of scores `x` `[N, C, d...]` at integer targets `[N, d...]`, of
/// `log_softmax(x, axis = 1)` when `softmax` (whose optional second output it binds).
fn nll(node: &Node, env: &Env, w: &mut Writer, softmax: bool) -> R<Out> {
    let x = operand(node, env, w, 0)?;
    let t = targets(node, env, w, &x)?;
    let (rank, classes) = (x.shape.len(), x.shape[1]);
    let reduction = node.string("reduction").unwrap_or_else(|| "mean".into());
    if !matches!(reduction.as_str(), "none" | "sum" | "mean") {
        return Err(node.err(
            format!("reduction `{reduction}` is not an ONNX reduction"),
            "ONNX defines reductions none, sum and mean; the file is malformed",
        ));
    }
    let ignored = match node.attr("ignore_index") {
        None => None,
        Some(a) if (0..classes as i64).contains(&a.i) => Some(a.i as usize),
        Some(a) => {
            return Err(node.err(
                format!("ignore_index {} is not one of the {classes} classes", a.i),
                format!(
                    "memc reads targets as ids 0 to {} of an embedding; ignore one of the classes",
                    classes.max(1) - 1
                ),
            ))
        }
    };
    let out = node.p.output.first().map_or("loss", String::as_str);
    let log_prob = softmax.then(|| {
        let name = match node.p.output.get(1).filter(|n| !n.is_empty()) {
            Some(n) => n.clone(),
            None => format!("{out}_log_prob"),
        };
        let e = format!("log_softmax({}, axis = 1)", x.expr);
        w.bind(&name, e, x.shape.clone(), x.syms.clone())
    });
    let x = log_prob.clone().unwrap_or(x);
    // The classes last: [N, d..., C], as the one-hot rows are laid out.
    let last = if rank == 2 {
        x.expr.clone()
    } else {
        let perm: Vec<String> = std::iter::once(0)
            .chain(2..rank)
            .chain(std::iter::once(1))
            .map(|k| k.to_string())
            .collect();
        format!("permute({}, ({}))", x.expr, perm.join(", "))
    };
    let mut eye = vec![0.0; classes * classes];
    for c in (0..classes).filter(|&c| Some(c) != ignored) {
        eye[c * classes + c] = 1.0;
    }
    let table = w.param(
        &format!("{out}.one_hot"),
        &Const::new(vec![classes, classes], Data::Float(eye)),
    );
    let one_hot = w.bind(
        &format!("{out}_one_hot"),
        format!("embed({}, {})", table.expr, t.expr),
        [&t.shape[..], &[classes]].concat(),
        [&t.syms[..], &[None]].concat(),
    );
    let classes_axis = rank - 1;
    let over_classes = |e: String| format!("sum({e}, axis = {classes_axis}, keepdim = false)");
    let picked = over_classes(format!("where({}, {last}, 0)", one_hot.expr));
    // The weight of each element's target; 0 where its target is ignored.
    let weight = match node.input_name(2) {
        Some(_) => {
            let wt = operand(node, env, w, 2)?;
            if wt.shape != [classes] {
                return Err(node.err(
                    format!("the weight is {:?}, not [{classes}]", wt.shape),
                    "the weight holds one number per class; the file is malformed",
                ));
            }
            Some(over_classes(format!("{} * {}", one_hot.expr, wt.expr)))
        }
        None => None,
    };
    let loss = match &weight {
        Some(wt) => format!("neg({picked} * {wt})"),
        None => format!("neg({picked})"),
    };
    let (expr, shape, syms) = if reduction == "none" {
        (loss, t.shape.clone(), t.syms.clone())
    } else {
        let every: Vec<String> = (0..t.shape.len()).map(|k| k.to_string()).collect();
        let every = tuple_text(&every);
        let total = |e: &str| format!("sum({e}, axis = {every}, keepdim = false)");
        let losses = w.bind(
            &format!("{out}_each"),
            loss,
            t.shape.clone(),
            t.syms.clone(),
        );
        let expr = if reduction == "sum" {
            total(&losses.expr)
        } else {
            let weights = weight.unwrap_or_else(|| over_classes(one_hot.expr.clone()));
            format!("{} / {}", total(&losses.expr), total(&weights))
        };
        (expr, Vec::new(), Vec::new())
    };
    match log_prob {
        Some(lp) if node.p.output.len() > 1 => {
            let loss = w.bind(out, expr, shape, syms);
            Ok(Out::Values(vec![Value::Dyn(loss), Value::Dyn(lp)]))
        }
        _ => Ok(Out::Expr(expr, shape, syms)),
    }
}

/// The targets: an integer graph input of shape `[N, d...]` for scores `x` `[N, C, d...]`.
fn targets(node: &Node, env: &Env, w: &mut Writer, x: &Dyn) -> R<Dyn> {
    let t = match node.input(env, 1)? {
        Value::Dyn(t) if w.is_integer(t) => t.clone(),
        _ => {
            return Err(node.err(
                "reads targets that are not an integer graph input",
                "memc imports losses whose targets are an integer input of the model",
            ))
        }
    };
    let expected: Vec<usize> = x
        .shape
        .iter()
        .enumerate()
        .filter(|&(k, _)| k != 1)
        .map(|(_, &d)| d)
        .collect();
    if x.shape.len() < 2 || t.shape != expected {
        return Err(node.err(
            format!(
                "scores {:?} and targets {:?} do not match",
                x.shape, t.shape
            ),
            "the scores are [N, C, d...] and the targets [N, d...]; the file is malformed",
        ));
    }
    Ok(t)
}
