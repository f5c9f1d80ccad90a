//! ONNX activations that `.mdl` has no single function for, composed from `relu`, `neg`,
//! `exp`, `tanh`, `softplus` and arithmetic, and `Mean` as a sum divided by the count.
//! The compositions are exact where the op is piecewise linear (`Abs`, `LeakyRelu`: one of
//! the two `relu` terms is zero), round like ONNX's reference where it computes the same
//! formula (`Elu`, `Selu`, `Celu`, `Mish`, `Softsign`), and `HardSigmoid` and `HardSwish`
//! clamp exactly (`clamp(y, 0, 1)`).

use super::{attr_number, broadcast_dyns, literal, operand, operands, same, Out, R};
use crate::onnx::write::Writer;
use crate::onnx::{Env, Node};

/// The activations this file maps.
pub(super) const OPS: &[&str] = &[
    "Abs",
    "Softsign",
    "Mish",
    "LeakyRelu",
    "Elu",
    "Selu",
    "Celu",
    "HardSigmoid",
    "HardSwish",
];

/// Maps `node` when it is one of these activations or `Mean`; `None` for other ops.
pub(super) fn map(node: &Node, env: &Env, w: &mut Writer) -> R<Option<Out>> {
    let op = node.op();
    if op == "Mean" {
        return mean(node, env, w).map(Some);
    }
    if !OPS.contains(&op) {
        return Ok(None);
    }
    let d = operand(node, env, w, 0)?;
    let x = d.expr.as_str();
    let alpha = |default: f32| attr_number(node, "alpha", default);
    // exp(min(x, 0) / scale) - 1: zero where x > 0.
    let neg_part = |scale: &str| format!("(exp(neg(relu(neg({x}))){scale}) - 1)");
    let expr = match op {
        "Abs" => format!("relu({x}) + relu(neg({x}))"),
        "Softsign" => format!("{x} / (1 + relu({x}) + relu(neg({x})))"),
        "Mish" => format!("{x} * tanh(softplus({x}))"),
        "LeakyRelu" => format!("relu({x}) - {} * relu(neg({x}))", alpha(0.01)?),
        "Elu" => format!("relu({x}) + {} * {}", alpha(1.0)?, neg_part("")),
        "Selu" => format!(
            "{} * (relu({x}) + {} * {})",
            attr_number(node, "gamma", 1.050_701)?,
            alpha(1.673_263_2)?,
            neg_part("")
        ),
        "Celu" => {
            let a = node.float("alpha", 1.0);
            if a <= 0.0 {
                return Err(node.err(
                    format!("alpha is {a}"),
                    "Celu is defined for a positive alpha",
                ));
            }
            let scale = format!(" / {}", literal(a));
            format!("relu({x}) + {} * {}", literal(a), neg_part(&scale))
        }
        "HardSigmoid" => clamp01(&format!(
            "{} * {x} + {}",
            alpha(0.2)?,
            attr_number(node, "beta", 0.5)?
        )),
        _ => format!("{x} * {}", clamp01(&format!("{x} / 6 + 0.5"))),
    };
    same(&d, expr).map(Some)
}

/// `min(max(y, 0), 1)`, exactly.
fn clamp01(y: &str) -> String {
    format!("clamp({y}, 0, 1)")
}

/// `Mean` of any number of operands: their sum divided by the count.
fn mean(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
    let ds = operands(node, env, w)?;
    if ds.is_empty() {
        return Err(node.err("has no inputs", "the file is malformed"));
    }
    let (out, syms) = broadcast_dyns(node, &ds)?;
    let terms: Vec<&str> = ds.iter().map(|d| d.expr.as_str()).collect();
    Ok(Out::Expr(
        format!("({}) / {}", terms.join(" + "), ds.len()),
        out,
        syms,
    ))
}
