//! ONNX selections as `.mdl` expressions: `Min`/`Max` (variadic, broadcasting), `Clip`
//! (opset 6 attributes, opset 11+ optional inputs; constant bounds as numbers, computed
//! ones as tensors), `Where`, the comparisons (`Less`, `LessOrEqual`, `Greater`,
//! `GreaterOrEqual`, `Equal`: boolean results held as 0/1 float masks, which only `Where`,
//! `Not`, `And`, `Or`, `Xor`, a `Cast` to float and a graph output may read) and `Expand`.

use super::{broadcast_dyns, broadcast_syms, literal, operand, operands, Out, R};
use crate::onnx::shapes::broadcast_inputs;
use crate::onnx::write::{shape_text, Writer};
use crate::onnx::{Dyn, Env, Node, Value};

/// The ONNX ops this file maps.
pub(super) const OPS: &[&str] = &[
    "Min",
    "Max",
    "Clip",
    "Where",
    "Less",
    "LessOrEqual",
    "Greater",
    "GreaterOrEqual",
    "Equal",
    "Not",
    "And",
    "Or",
    "Xor",
    "Expand",
];

/// Maps `node` when it is a selection; `None` for other ops.
pub(super) fn map(node: &Node, env: &Env, w: &mut Writer) -> R<Option<Out>> {
    let out = match node.op() {
        "Min" => extremum(node, env, w, "minimum"),
        "Max" => extremum(node, env, w, "maximum"),
        "Clip" => clip(node, env, w),
        "Where" => select(node, env, w),
        "Less" => compare(node, env, w, "less"),
        "LessOrEqual" => compare(node, env, w, "less_equal"),
        "Greater" => compare(node, env, w, "greater"),
        "GreaterOrEqual" => compare(node, env, w, "greater_equal"),
        "Equal" => compare(node, env, w, "equal"),
        "Not" | "And" | "Or" | "Xor" => logic(node, env, w),
        "Expand" => expand(node, env, w),
        _ => return Ok(None),
    };
    out.map(Some)
}

/// Every input as a float operand: integer inputs are refused (masks never reach here:
/// `map` refuses them first).
fn floats(node: &Node, env: &Env, w: &mut Writer) -> R<Vec<Dyn>> {
    let ds = operands(node, env, w)?;
    for d in &ds {
        if w.is_integer(d) {
            return Err(node.err(
                format!("reads `{}`, which is not a float tensor", d.expr),
                "memc imports this operator on float tensors only",
            ));
        }
    }
    Ok(ds)
}

/// A new value bound to the node's output and marked as a boolean mask.
fn mask(
    node: &Node,
    w: &mut Writer,
    expr: String,
    shape: Vec<usize>,
    syms: Vec<Option<String>>,
) -> Out {
    let name = node.p.output.first().cloned().unwrap_or_default();
    let d = w.bind(&name, expr, shape, syms);
    w.mark_mask(&d);
    Out::Values(vec![Value::Dyn(d)])
}

/// `Min`/`Max` of any number of operands, left to right.
fn extremum(node: &Node, env: &Env, w: &mut Writer, f: &str) -> R<Out> {
    let ds = floats(node, env, w)?;
    let Some((first, rest)) = ds.split_first() else {
        return Err(node.err("has no inputs", "the file is malformed"));
    };
    if rest.is_empty() {
        return Ok(Out::Values(vec![Value::Dyn(first.clone())]));
    }
    let (shape, syms) = broadcast_dyns(node, &ds)?;
    let expr = rest.iter().fold(first.expr.clone(), |acc, d| {
        format!("{f}({acc}, {})", d.expr)
    });
    Ok(Out::Expr(expr, shape, syms))
}

/// A comparison of two float operands: a boolean mask.
fn compare(node: &Node, env: &Env, w: &mut Writer, f: &str) -> R<Out> {
    let ds = floats(node, env, w)?;
    let [a, b] = &ds[..] else {
        return Err(node.err("needs two inputs", "the file is malformed"));
    };
    let (shape, syms) = broadcast_dyns(node, &ds)?;
    Ok(mask(
        node,
        w,
        format!("{f}({}, {})", a.expr, b.expr),
        shape,
        syms,
    ))
}

/// Operand `i` as a boolean mask: a comparison's result, or a constant (0/1 as stored).
fn mask_operand(node: &Node, env: &Env, w: &mut Writer, i: usize) -> R<Dyn> {
    let d = operand(node, env, w, i)?;
    let constant = matches!(node.input(env, i)?, Value::Const(_));
    if !constant && !w.is_mask(&d) {
        return Err(node.err(
            format!(
                "reads the boolean `{}`, which is not a comparison's result",
                d.expr
            ),
            "memc imports boolean values computed by Less, Greater, Equal and their \
             combinations (Not, And, Or), or constant ones",
        ));
    }
    Ok(d)
}

/// `Not`, `And`, `Or`, `Xor` of masks: `1 - m`, `m * n`, `maximum(m, n)`,
/// `maximum(m, n) - m * n`.
fn logic(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
    let a = mask_operand(node, env, w, 0)?;
    if node.op() == "Not" {
        return Ok(mask(
            node,
            w,
            format!("1 - {}", a.expr),
            a.shape.clone(),
            a.syms.clone(),
        ));
    }
    let b = mask_operand(node, env, w, 1)?;
    let ds = [a, b];
    let (shape, syms) = broadcast_dyns(node, &ds)?;
    let expr = match node.op() {
        "And" => format!("{} * {}", ds[0].expr, ds[1].expr),
        "Xor" => format!(
            "maximum({a}, {b}) - {a} * {b}",
            a = ds[0].expr,
            b = ds[1].expr
        ),
        _ => format!("maximum({}, {})", ds[0].expr, ds[1].expr),
    };
    Ok(mask(node, w, expr, shape, syms))
}

/// `Where(cond, x, y)`: `where(cond, x, y)`; a boolean result when `x` and `y` are.
fn select(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
    let c = mask_operand(node, env, w, 0)?;
    let x = operand(node, env, w, 1)?;
    let y = operand(node, env, w, 2)?;
    let (bx, by) = (w.is_mask(&x), w.is_mask(&y));
    if w.is_integer(&x) || w.is_integer(&y) {
        return Err(node.err(
            "selects integer tensors",
            "memc imports Where over float tensors and boolean masks",
        ));
    }
    let ds = [c, x, y];
    let (shape, syms) = broadcast_dyns(node, &ds)?;
    let expr = format!("where({}, {}, {})", ds[0].expr, ds[1].expr, ds[2].expr);
    if bx && by {
        return Ok(mask(node, w, expr, shape, syms));
    }
    Ok(Out::Expr(expr, shape, syms))
}

/// `Clip`: bounds from attributes (opset < 11) or optional inputs; a constant bound is a
/// number (an infinite one clamps nothing and is left out), a computed one a tensor.
fn clip(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
    let x = operand(node, env, w, 0)?;
    if w.is_integer(&x) {
        return Err(node.err(
            "clips a tensor that is not float",
            "memc imports Clip on float tensors",
        ));
    }
    let mut bounds = Vec::new();
    for (i, name) in [(1, "lo"), (2, "hi")] {
        let text = if node.opset < 11 {
            let v = node.float(if i == 1 { "min" } else { "max" }, f32::NAN);
            number_bound(v)
        } else if node.input_name(i).is_none() {
            None
        } else {
            match node.input(env, i)? {
                Value::Const(c) if c.data.len() == 1 => number_bound(c.floats()[0]),
                Value::Const(c) => {
                    return Err(node.err(
                        format!("bound `{name}` has {} elements", c.data.len()),
                        "Clip's bounds are scalars; the file is malformed",
                    ))
                }
                Value::Dyn(_) => Some(operand(node, env, w, i)?.expr),
            }
        };
        if let Some(t) = text {
            bounds.push(format!("{name} = {t}"));
        }
    }
    if bounds.is_empty() {
        return Ok(Out::Values(vec![Value::Dyn(x)]));
    }
    let expr = format!("clamp({}, {})", x.expr, bounds.join(", "));
    Ok(Out::Expr(expr, x.shape.clone(), x.syms.clone()))
}

/// A constant bound as a number; None when it clamps nothing (infinite, or NaN: absent).
fn number_bound(v: f32) -> Option<String> {
    v.is_finite().then(|| literal(v))
}

/// `Expand(x, shape)` with a constant shape: `x` broadcast with `shape` (either may hold
/// the 1s); a result of `x`'s own shape is `x`.
fn expand(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
    let x = operand(node, env, w, 0)?;
    let target: Vec<usize> = node
        .konst(env, 1)?
        .ints()
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<Result<_, _>>()
        .map_err(|_| node.err("has a negative dim in its shape", "the file is malformed"))?;
    let out = broadcast_inputs(node, &[&x.shape[..], &target[..]])?;
    if out == x.shape {
        return Ok(Out::Values(vec![Value::Dyn(x)]));
    }
    let out_syms = broadcast_syms(&out, &[&x]);
    let text = shape_text(&out, &out_syms);
    let expr = format!("expand({}, ({text}))", x.expr);
    Ok(Out::Expr(expr, out, out_syms))
}
