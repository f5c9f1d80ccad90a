//! ONNX ops whose operands are computed at run time (or whose form memc's layers do not
//! cover), written as `.mdl` arithmetic instead of a parameterized layer: `Gemm` with a
//! computed `B` or `C` as `alpha * (A' @ B') + beta * C`, and `LayerNormalization` with
//! computed scale or bias, over several trailing axes, or with its `Mean` and `InvStdDev`
//! outputs, as ONNX's own function body computes it (mean, centred square mean, `rsqrt`);
//! `BatchNormalization` with computed statistics, scale or bias, or in training mode (the
//! batch's statistics, and the running ones as outputs), as
//! `(x - mean) / sqrt(var + epsilon) * scale + bias` per channel.

use super::{attr_number, literal, operand, Out, R};
use crate::onnx::shapes::{axis, broadcast};
use crate::onnx::write::{number, shape_text, Writer};
use crate::onnx::{Dyn, Env, Node, Value};

/// Maps `node` when it is a `Gemm` or `LayerNormalization` that the layer mappings
/// (`dense`) cannot express; `None` otherwise.
pub(super) fn map(node: &Node, env: &Env, w: &mut Writer) -> R<Option<Out>> {
    let computed = |i: usize| matches!(node.input(env, i), Ok(Value::Dyn(_)));
    match node.op() {
        "Gemm" if computed(1) || computed(2) => gemm(node, env, w).map(Some),
        "BatchNormalization" if (1..5).any(computed) || node.int("training_mode", 0) != 0 => {
            batchnorm(node, env, w).map(Some)
        }
        "LayerNormalization" => {
            let rank = match node.input(env, 0) {
                Ok(Value::Dyn(x)) => x.shape.len(),
                _ => return Ok(None),
            };
            let last_axis = axis(node, node.int("axis", -1), rank)? + 1 == rank;
            let extra_outputs = node.p.output.iter().skip(1).any(|o| !o.is_empty());
            if last_axis && !extra_outputs && !computed(1) && !computed(2) {
                return Ok(None);
            }
            layernorm(node, env, w).map(Some)
        }
        _ => Ok(None),
    }
}

/// `x` or `transpose(x)` of a rank-2 operand, with its shape after the transpose.
fn maybe_transposed(node: &Node, d: &Dyn, flag: &str) -> R<(String, [usize; 2])> {
    let &[r, c] = &d.shape[..] else {
        return Err(node.err("Gemm needs rank-2 operands", "the file is malformed"));
    };
    Ok(if node.int(flag, 0) != 0 {
        (format!("transpose({})", d.expr), [c, r])
    } else {
        (d.expr.clone(), [r, c])
    })
}

/// A factor in front of `term`: nothing when it is 1.
fn scaled(factor: f32, term: &str) -> String {
    if factor == 1.0 {
        term.to_string()
    } else {
        format!("{} * {term}", literal(factor))
    }
}

/// `Gemm` as `alpha * (A' @ B') + beta * C`.
fn gemm(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
    let a = operand(node, env, w, 0)?;
    let b = operand(node, env, w, 1)?;
    let (at, [m, ka]) = maybe_transposed(node, &a, "transA")?;
    let (bt, [kb, n]) = maybe_transposed(node, &b, "transB")?;
    if ka != kb {
        return Err(node.err(
            format!("inner sizes {ka} and {kb} differ"),
            "the file is malformed",
        ));
    }
    let (alpha, beta) = (node.float("alpha", 1.0), node.float("beta", 1.0));
    if !alpha.is_finite() || !beta.is_finite() {
        return Err(node.err(
            format!("alpha {alpha} or beta {beta} is not finite"),
            "memc imports finite attribute values",
        ));
    }
    let mut expr = scaled(alpha, &format!("({at} @ {bt})"));
    if node.input_name(2).is_some() {
        let c = operand(node, env, w, 2)?;
        if broadcast(&[&[m, n], &c.shape]) != Some(vec![m, n]) {
            return Err(node.err(
                format!("C of shape {:?} does not broadcast to [{m}, {n}]", c.shape),
                "the file is malformed",
            ));
        }
        expr = format!("{expr} + {}", scaled(beta, &c.expr));
    }
    let mut syms = vec![None, None];
    if node.int("transA", 0) == 0 {
        syms[0] = a.syms[0].clone();
    }
    Ok(Out::Expr(expr, vec![m, n], syms))
}

/// `LayerNormalization` over the axes from `axis` on: `x` flattened to [outer, inner],
/// normalized by its mean and `rsqrt` of its centred square mean plus epsilon, scaled and
/// shifted; `Mean` and `InvStdDev` when the node names them, shaped as ONNX states (the
/// normalized axes kept as 1).
fn layernorm(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
    let x = operand(node, env, w, 0)?;
    let rank = x.shape.len();
    let ax = axis(node, node.int("axis", -1), rank)?;
    let outer: usize = x.shape[..ax].iter().product();
    let inner: usize = x.shape[ax..].iter().product();
    let eps = node.float("epsilon", 1e-5);
    if !eps.is_finite() {
        return Err(node.err(format!("epsilon is {eps}"), "memc imports a finite epsilon"));
    }
    let name = |k: usize, what: &str| {
        let out = node.p.output.first().map_or("ln", String::as_str);
        node.p
            .output
            .get(k)
            .filter(|o| !o.is_empty())
            .cloned()
            .unwrap_or_else(|| format!("{out}_{what}"))
    };
    let flat = |d: &Dyn| format!("reshape({}, ({outer}, {inner}))", d.expr);
    let row = vec![outer, 1];
    let none = vec![None, None];
    let mean = w.bind(
        &name(1, "mean"),
        format!("mean({}, axis = 1, keepdim = true)", flat(&x)),
        row.clone(),
        none.clone(),
    );
    let centred = w.bind(
        &name(0, "centred"),
        format!("{} - {}", flat(&x), mean.expr),
        vec![outer, inner],
        none.clone(),
    );
    let inv = w.bind(
        &name(2, "inv_std"),
        format!(
            "rsqrt(mean({c} * {c}, axis = 1, keepdim = true) + {})",
            number(eps),
            c = centred.expr
        ),
        row,
        none,
    );
    let mut y = format!(
        "reshape({} * {}, ({}))",
        centred.expr,
        inv.expr,
        shape_text(&x.shape, &x.syms)
    );
    for (i, op) in [(1, "*"), (2, "+")] {
        if node.input_name(i).is_none() {
            continue;
        }
        let p = operand(node, env, w, i)?;
        if broadcast(&[&x.shape, &p.shape]).as_ref() != Some(&x.shape) {
            return Err(node.err(
                format!(
                    "scale or bias of shape {:?} does not broadcast to {:?}",
                    p.shape, x.shape
                ),
                "the file is malformed",
            ));
        }
        y = format!("({y}) {op} {}", p.expr);
    }
    let y = w.bind(&name(0, "y"), y, x.shape.clone(), x.syms.clone());
    let stat_shape: Vec<usize> = (0..rank)
        .map(|k| if k < ax { x.shape[k] } else { 1 })
        .collect();
    let stat_syms: Vec<Option<String>> = (0..rank)
        .map(|k| if k < ax { x.syms[k].clone() } else { None })
        .collect();
    let mut values = vec![Value::Dyn(y.clone())];
    for (k, stat) in [(1, &mean), (2, &inv)] {
        if node.p.output.get(k).is_none_or(String::is_empty) {
            // Unnamed: the importer binds no value to it.
            values.push(Value::Dyn(y.clone()));
        } else {
            let expr = format!(
                "reshape({}, ({}))",
                stat.expr,
                shape_text(&stat_shape, &stat_syms)
            );
            let d = w.bind(
                &name(k, "stat"),
                expr,
                stat_shape.clone(),
                stat_syms.clone(),
            );
            values.push(Value::Dyn(d));
        }
    }
    Ok(Out::Values(values))
}

/// `BatchNormalization` whose statistics, scale or bias are computed, or in training mode:
/// each `[C]` operand reshaped to broadcast over the channel axis. In training mode the
/// statistics are the batch's (mean and population variance over every axis but the
/// channels), and the optional outputs 1 and 2 are the running mean and variance,
/// `input * momentum + batch statistic * (1 - momentum)`.
fn batchnorm(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
    let x = operand(node, env, w, 0)?;
    let c = x.shape.get(1).copied().unwrap_or(0);
    let mut per_channel = vec![c];
    per_channel.resize(x.shape.len().saturating_sub(1), 1);
    let mut ps = Vec::new();
    let mut flat = Vec::new();
    for i in 1..5 {
        let p = operand(node, env, w, i)?;
        if p.shape != [c] {
            return Err(node.err(
                format!("input {i} has shape {:?}, expected [{c}]", p.shape),
                "the file is malformed",
            ));
        }
        ps.push(format!(
            "reshape({}, ({}))",
            p.expr,
            shape_text(&per_channel, &[])
        ));
        flat.push(p.expr);
    }
    let eps = attr_number(node, "epsilon", 1e-5)?;
    if node.int("training_mode", 0) == 0 {
        let expr = format!(
            "({} - {}) / sqrt({} + {eps}) * {} + {}",
            x.expr, ps[2], ps[3], ps[0], ps[1]
        );
        return Ok(Out::Expr(expr, x.shape.clone(), x.syms.clone()));
    }
    let out = |k: usize| node.p.output.get(k).filter(|o| !o.is_empty()).cloned();
    let base = out(0).unwrap_or_default();
    let axes: Vec<usize> = (0..x.shape.len()).filter(|&k| k != 1).collect();
    let [mean, centred, var] = centred_moments(w, &base, &x, &axes);
    let y = w.bind(
        &base,
        format!(
            "{} / sqrt({} + {eps}) * {} + {}",
            centred.expr, var.expr, ps[0], ps[1]
        ),
        x.shape.clone(),
        x.syms.clone(),
    );
    let momentum = node.float("momentum", 0.9);
    if !momentum.is_finite() {
        return Err(node.err(
            format!("attribute `momentum` is {momentum}"),
            "memc imports finite attribute values",
        ));
    }
    let mut values = vec![Value::Dyn(y.clone())];
    for (k, stat, running) in [(1, &mean, &flat[2]), (2, &var, &flat[3])] {
        let Some(name) = out(k) else {
            // Unnamed: the importer binds no value to it.
            values.push(Value::Dyn(y.clone()));
            continue;
        };
        let expr = format!(
            "{running} * {} + reshape({}, ({c})) * {}",
            literal(momentum),
            stat.expr,
            literal(1.0 - momentum)
        );
        values.push(Value::Dyn(w.bind(&name, expr, vec![c], vec![None])));
    }
    Ok(Out::Values(values))
}

/// The mean of `x` over `axes`, `x` less it, and the mean of that square over `axes` (the
/// population variance), the reduced axes kept as dims of 1, bound as `<base>_mean`,
/// `<base>_centred` and `<base>_var`: a batch or instance normalization's statistics.
pub(super) fn centred_moments(w: &mut Writer, base: &str, x: &Dyn, axes: &[usize]) -> [Dyn; 3] {
    let listed: Vec<String> = axes.iter().map(usize::to_string).collect();
    let axes_text = match &listed[..] {
        [one] => one.clone(),
        _ => format!("({})", listed.join(", ")),
    };
    let kept: Vec<usize> = (0..x.shape.len())
        .map(|k| if axes.contains(&k) { 1 } else { x.shape[k] })
        .collect();
    let none = vec![None; kept.len()];
    let mean = w.bind(
        &format!("{base}_mean"),
        format!("mean({}, axis = {axes_text}, keepdim = true)", x.expr),
        kept.clone(),
        none.clone(),
    );
    let centred = w.bind(
        &format!("{base}_centred"),
        format!("{} - {}", x.expr, mean.expr),
        x.shape.clone(),
        x.syms.clone(),
    );
    let var = w.bind(
        &format!("{base}_var"),
        format!(
            "mean({0} * {0}, axis = {axes_text}, keepdim = true)",
            centred.expr
        ),
        kept,
        none,
    );
    [mean, centred, var]
}
