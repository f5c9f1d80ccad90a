//! ONNX ops that contract or normalize the last axis, as `.mdl` expressions: `Gemm`,
//! `MatMul`, `LayerNormalization`, `Softmax`/`LogSoftmax`, and `Gather` as an embedding
//! lookup (of a constant table, or of a computed tensor at integer graph-input ids).

use super::{batch_named, broadcast_syms, group_name, operand, reshape_expr, same, Out, R};
use crate::onnx::shapes::{axis, broadcast};
use crate::onnx::tensor::Const;
use crate::onnx::write::{number, shape_text, Writer};
use crate::onnx::{Dyn, Env, Node, Value};

/// Maps `node` when it is a dense op; `None` for other ops.
pub(super) fn map(node: &Node, env: &Env, w: &mut Writer) -> R<Option<Out>> {
    let out = match node.op() {
        "Gemm" => batch_named(node, env, w, gemm),
        "MatMul" => matmul_op(node, env, w),
        "LayerNormalization" => layernorm(node, env, w),
        "Softmax" | "LogSoftmax" => softmax(node, env, w),
        "Gather" => gather(node, env, w),
        _ => return Ok(None),
    };
    out.map(Some)
}

fn gemm(node: &Node, env: &Env, w: &mut Writer) -> R<(String, Vec<usize>)> {
    let a = operand(node, env, w, 0)?;
    let bw = node.konst(env, 1)?;
    let (ta, tb) = (node.int("transA", 0) != 0, node.int("transB", 0) != 0);
    let (alpha, beta) = (node.float("alpha", 1.0), node.float("beta", 1.0));
    let ([m, ka], [kb, n]) = match (&a.shape[..], &bw.shape[..]) {
        (&[r, c], &[p, q]) => (
            if ta { [c, r] } else { [r, c] },
            if tb { [q, p] } else { [p, q] },
        ),
        _ => return Err(node.err("Gemm needs rank-2 operands", "the file is malformed")),
    };
    if ka != kb {
        return Err(node.err(
            format!("inner sizes {ka} and {kb} differ"),
            "the file is malformed",
        ));
    }
    // The weight as `linear` holds it: [K, N], scaled by alpha.
    let src = bw.floats();
    let weight: Vec<f32> = (0..ka * n)
        .map(|i| {
            let (k, j) = (i / n, i % n);
            alpha * if tb { src[j * ka + k] } else { src[k * n + j] }
        })
        .collect();
    let mut parts = vec![("weight".to_string(), vec![ka, n], weight)];
    let mut extra = None;
    if let Some(cn) = node.input_name(2) {
        let cv = node.konst(env, 2)?;
        let scaled: Vec<f32> = cv.floats().iter().map(|&v| beta * v).collect();
        if cv.shape == [n] || cv.shape == [1, n] {
            parts.push(("bias".to_string(), vec![n], scaled));
        } else if broadcast(&[&[m, n], &cv.shape]) == Some(vec![m, n]) {
            let d = w.param(
                &format!("{cn}_scaled"),
                &Const::new(cv.shape.clone(), crate::onnx::tensor::Data::Float(scaled)),
            );
            extra = Some(d.expr);
        } else {
            return Err(node.err(
                format!("C of shape {:?} does not broadcast to [{m}, {n}]", cv.shape),
                "the file is malformed",
            ));
        }
    }
    let bias = if parts.len() > 1 {
        ""
    } else {
        ", bias = false"
    };
    let g = w.group(
        &group_name(node, 1),
        format!("linear({ka}, {n}{bias})"),
        parts,
    );
    let x = if ta {
        format!("transpose({})", a.expr)
    } else {
        a.expr
    };
    let mut expr = format!("linear({x}, {g})");
    if let Some(e) = extra {
        expr += &format!(" + {e}");
    }
    Ok((expr, vec![m, n]))
}

fn matmul(node: &Node, a: &Dyn, b: &Dyn) -> R<Vec<usize>> {
    let (ra, rb) = (a.shape.len(), b.shape.len());
    if ra < 2 || rb < 2 || a.shape[ra - 1] != b.shape[rb - 2] {
        return Err(node.err(
            format!("cannot multiply {:?} by {:?}", a.shape, b.shape),
            "memc imports MatMul of rank-2 or higher operands with matching inner sizes",
        ));
    }
    let mut out = broadcast(&[&a.shape[..ra - 2], &b.shape[..rb - 2]])
        .ok_or_else(|| node.err("batch dims do not broadcast", "the file is malformed"))?;
    out.extend([a.shape[ra - 2], b.shape[rb - 1]]);
    Ok(out)
}

/// `MatMul` as `a @ b`.
fn matmul_op(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
    let a = operand(node, env, w, 0)?;
    let b = operand(node, env, w, 1)?;
    let shape = matmul(node, &a, &b)?;
    let syms = broadcast_syms(&shape[..shape.len() - 2], &[&a, &b])
        .into_iter()
        .chain([a.syms[a.shape.len() - 2].clone(), None])
        .collect();
    Ok(Out::Expr(format!("{} @ {}", a.expr, b.expr), shape, syms))
}

/// `LayerNormalization` over the last axis.
fn layernorm(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
    let x = operand(node, env, w, 0)?;
    let rank = x.shape.len();
    if axis(node, node.int("axis", -1), rank)? + 1 != rank {
        return Err(node.err(
            "normalizes over more than the last axis",
            "memc's layernorm normalizes the last axis only",
        ));
    }
    let d = x.shape[rank - 1];
    let scale = node.konst(env, 1)?;
    let mut parts = vec![("weight".to_string(), vec![d], scale.floats())];
    if node.input_name(2).is_some() {
        parts.push(("bias".to_string(), vec![d], node.konst(env, 2)?.floats()));
    }
    if parts.iter().any(|p| p.1 != vec![d] || p.2.len() != d) {
        return Err(node.err(
            "scale and bias must have the last axis' size",
            "the file is malformed",
        ));
    }
    let bias = if parts.len() == 2 {
        ""
    } else {
        ", bias = false"
    };
    let g = w.group(&group_name(node, 1), format!("layernorm({d}{bias})"), parts);
    let eps = number(node.float("epsilon", 1e-5));
    same(&x, format!("layernorm({}, {g}, eps = {eps})", x.expr))
}

/// `Softmax` / `LogSoftmax`; before opset 13 over the input coerced to 2-D at `axis`.
fn softmax(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
    let op = node.op();
    let x = operand(node, env, w, 0)?;
    let rank = x.shape.len();
    let default = if node.opset < 13 { 1 } else { -1 };
    let ax = axis(node, node.int("axis", default), rank)?;
    let f = if op == "Softmax" {
        "softmax"
    } else {
        "log_softmax"
    };
    let trailing: usize = x.shape[ax + 1..].iter().product();
    if node.opset >= 13 || trailing == 1 {
        let a = if ax + 1 == rank {
            String::new()
        } else {
            format!(", axis = {ax}")
        };
        same(&x, format!("{f}({}{a})", x.expr))
    } else {
        // Before opset 13 the input is coerced to 2-D at `axis`.
        let lead: usize = x.shape[..ax].iter().product();
        let lead_sym = if ax == 1 { x.syms[0].clone() } else { None };
        let flat = reshape_expr(&x, &[lead, 1], &[lead_sym, Some("-1".into())]);
        let back = shape_text(&x.shape, &x.syms);
        same(&x, format!("reshape({f}({flat}), ({back}))"))
    }
}

/// `Gather` of rows of a constant `[V, D]` table: `embed`; from a computed tensor,
/// [`gather_computed`].
fn gather(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
    let table = match node.input(env, 0)? {
        Value::Const(c) => c,
        Value::Dyn(data) => return gather_computed(node, env, w, data),
    };
    let ids = operand(node, env, w, 1)?;
    if node.int("axis", 0) != 0 || table.shape.len() != 2 {
        return Err(node.err(
            "is not a row lookup in a 2-D table",
            "memc imports Gather as an embedding lookup (axis 0 of a [V, D] table)",
        ));
    }
    let t = w.param(node.input_name(0).unwrap_or("table"), table);
    let mut shape = ids.shape.clone();
    shape.push(table.shape[1]);
    let mut syms = ids.syms.clone();
    syms.push(None);
    Ok(Out::Expr(
        format!("embed({}, {})", t.expr, ids.expr),
        shape,
        syms,
    ))
}

/// `Gather` from a computed tensor at ids that are an integer graph input: the gathered axis
/// moved to the front, the rest flattened into rows, `embed`, then the result reshaped and
/// its axes put back in ONNX's order (`data[:a] + ids + data[a+1:]`).
fn gather_computed(node: &Node, env: &Env, w: &mut Writer, data: &Dyn) -> R<Out> {
    let ids = operand(node, env, w, 1)?;
    if !w.is_integer(&ids) || ids.shape.is_empty() {
        return Err(node.err(
            "gathers from a computed tensor at ids that are not an integer graph input of rank 1 or more",
            "memc imports Gather from a computed tensor as an embedding lookup at integer input ids",
        ));
    }
    let rank = data.shape.len();
    let a = axis(node, node.int("axis", 0), rank)?;
    let text = |v: &[usize]| {
        let items: Vec<String> = v.iter().map(usize::to_string).collect();
        items.join(", ")
    };
    let front: Vec<usize> = std::iter::once(a)
        .chain((0..rank).filter(|&k| k != a))
        .collect();
    let moved = if a == 0 {
        data.expr.clone()
    } else {
        format!("permute({}, ({}))", data.expr, text(&front))
    };
    let rest: Vec<usize> = front[1..].iter().map(|&k| data.shape[k]).collect();
    let rows: usize = rest.iter().product();
    let table = format!("reshape({moved}, ({}, {rows}))", data.shape[a]);
    let k = ids.shape.len();
    let gathered = [&ids.shape[..], &rest[..]].concat();
    let mut expr = format!(
        "reshape(embed({table}, {}), ({}))",
        ids.expr,
        text(&gathered)
    );
    if a != 0 {
        // [ids, pre, post] -> [pre, ids, post].
        let order: Vec<usize> = (k..k + a).chain(0..k).chain(k + a..k + rank - 1).collect();
        expr = format!("permute({expr}, ({}))", text(&order));
    }
    let shape = [&data.shape[..a], &ids.shape[..], &data.shape[a + 1..]].concat();
    let syms = [&data.syms[..a], &ids.syms[..], &data.syms[a + 1..]].concat();
    Ok(Out::Expr(expr, shape, syms))
}
