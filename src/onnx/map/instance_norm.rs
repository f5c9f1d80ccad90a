//! ONNX `InstanceNormalization` as `.mdl`: each sample's channels normalized over space.

use super::{group_name, operand, same, Out, R};
use crate::onnx::write::{number, shape_text, Writer};
use crate::onnx::{Env, Node, Value};

/// `InstanceNormalization`: each sample's channels normalized over space. A constant scale
/// and bias make a `groupnorm` with one group per channel; computed ones scale and shift the
/// normalized input through `[C, 1, ...]` views.
pub(super) fn instance_norm(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
    let x = operand(node, env, w, 0)?;
    let rank = x.shape.len();
    if rank < 3 {
        return Err(node.err(
            format!("input has rank {rank}, not N, C and spatial dims"),
            "the file is malformed",
        ));
    }
    let c = x.shape[1];
    let eps = node.float("epsilon", 1e-5);
    if !eps.is_finite() {
        return Err(node.err(format!("epsilon is {eps}"), "memc imports a finite epsilon"));
    }
    let constant = [1, 2].map(|i| matches!(node.input(env, i), Ok(Value::Const(_))));
    if constant == [true, true] {
        let mut parts = Vec::new();
        for (i, what) in [(1, "weight"), (2, "bias")] {
            let k = node.konst(env, i)?;
            if k.shape != [c] {
                return Err(node.err(
                    format!("input {i} has shape {:?}, expected [{c}]", k.shape),
                    "the file is malformed",
                ));
            }
            parts.push((what.to_string(), vec![c], k.floats()));
        }
        let g = w.group(&group_name(node, 1), format!("groupnorm({c}, {c})"), parts);
        return same(
            &x,
            format!("groupnorm({}, {g}, eps = {})", x.expr, number(eps)),
        );
    }
    let mut per_channel = vec![c];
    per_channel.resize(rank - 1, 1);
    let mut views = Vec::new();
    for i in [1, 2] {
        let p = operand(node, env, w, i)?;
        if p.shape != [c] {
            return Err(node.err(
                format!("input {i} has shape {:?}, expected [{c}]", p.shape),
                "the file is malformed",
            ));
        }
        views.push(format!(
            "reshape({}, ({}))",
            p.expr,
            shape_text(&per_channel, &[])
        ));
    }
    let base = node.p.output.first().cloned().unwrap_or_default();
    let axes: Vec<usize> = (2..rank).collect();
    let [_, centred, var] = super::composed::centred_moments(w, &base, &x, &axes);
    same(
        &x,
        format!(
            "{} / sqrt({} + {}) * {} + {}",
            centred.expr,
            var.expr,
            number(eps),
            views[0],
            views[1]
        ),
    )
}
