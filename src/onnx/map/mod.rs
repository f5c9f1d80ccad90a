//! Maps each run-time ONNX node to `.mdl` expressions with exactly its semantics; constant
//! operands become parameters. Every unsupported op or attribute is a diagnostic. Each op
//! family has its own file: [`elementwise`], [`select`] (extrema, comparisons, `Where`,
//! `Clip`, `Expand`), [`window`] (NCHW windows), [`dense`] (contractions and last-axis ops),
//! [`layout`] (reductions and data movement) and [`loss`] (the likelihood losses).

mod activation;
mod composed;
mod conv;
mod conv_transpose;
mod dense;
mod einsum;
mod elementwise;
mod instance_norm;
mod layout;
mod loss;
mod resize;
mod select;
mod window;

use super::shapes::broadcast_inputs;
use super::write::{shape_text, Writer};
use super::{Dyn, Env, Node, Value};
use crate::diagnostic::UserError;

type R<T> = Result<T, UserError>;

/// The run-time ONNX ops the importer maps besides the unary functions (those come from
/// [`UnaryFn::onnx_name`](crate::ir::UnaryFn::onnx_name)); some only with the attributes
/// their mapping states, refusing the rest.
const MAPPED: &[&str] = &[
    "Conv",
    "ConvTranspose",
    "Gemm",
    "MatMul",
    "BatchNormalization",
    "InstanceNormalization",
    "Einsum",
    "Gelu",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "LRN",
    "LayerNormalization",
    "Softmax",
    "LogSoftmax",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Sum",
    "Concat",
    "Reshape",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Transpose",
    "Split",
    "Slice",
    "CastLike",
    "Pow",
    "Resize",
    "Upsample",
    "Pad",
    "ReduceMean",
    "ReduceSum",
    "ReduceMax",
    "Gather",
    "Dropout",
    "Identity",
    "Cast",
    "Mean",
    "ReduceMin",
    "ReduceSumSquare",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "DepthToSpace",
    "SpaceToDepth",
];

/// Every ONNX op type the importer maps at run time (some only with certain attributes or
/// operands; anything else about them is refused with a diagnostic), sorted by name.
pub fn mapped_ops() -> Vec<&'static str> {
    let mut ops: Vec<&str> = crate::ir::UnaryFn::ALL
        .iter()
        .filter_map(|f| f.onnx_name())
        .chain(MAPPED.iter().copied())
        .chain(activation::OPS.iter().copied())
        .chain(select::OPS.iter().copied())
        .chain(loss::OPS.iter().copied())
        .collect();
    ops.sort_unstable();
    ops.dedup();
    ops
}

/// Every ONNX op the importer maps, for the help line of an unsupported one.
fn supported() -> String {
    format!(
        "{} (Resize/Upsample nearest, linear or cubic over the last two axes (not tf_crop_and_resize), Pad constant on H and W, \
         Gather as an embedding (of a constant table, or at integer input ids), Cast to float, Slice with step 1, Expand to a constant shape, \
         comparisons as masks), and any op on constants that folding evaluates",
        mapped_ops().join(", ")
    )
}

/// What a node maps to.
enum Out {
    /// A new `.mdl` value: its expression, shape and dim names.
    Expr(String, Vec<usize>, Vec<Option<String>>),
    /// Values already bound: the input passed on, or outputs the mapping bound itself.
    Values(Vec<Value>),
}

/// The mapping of one op family: `None` when the node's op is not in the family.
type Family = fn(&Node, &Env, &mut Writer) -> R<Option<Out>>;

/// Maps `node` to `.mdl` statements; returns its output values.
pub(super) fn map(node: &Node, env: &Env, w: &mut Writer) -> R<Vec<Value>> {
    refuse_masks(node, env, w)?;
    let families: [Family; 10] = [
        elementwise::map,
        einsum::map,
        select::map,
        activation::map,
        composed::map,
        conv::map,
        window::map,
        dense::map,
        layout::map,
        loss::map,
    ];
    for family in families {
        match family(node, env, w)? {
            Some(Out::Expr(expr, shape, syms)) => {
                let out_name = node.p.output.first().cloned().unwrap_or_default();
                return Ok(vec![Value::Dyn(w.bind(&out_name, expr, shape, syms))]);
            }
            Some(Out::Values(values)) => return Ok(values),
            None => {}
        }
    }
    Err(node.err(
        format!("operator `{}` is not supported", node.op()),
        format!("memc imports {}", supported()),
    ))
}

/// The ops that read a comparison's 0/1 mask as the boolean it stands for.
const MASK_READERS: &[&str] = &["Where", "Not", "And", "Or", "Xor", "Cast", "Identity"];

/// Refuses a node that is not a mask reader but reads a mask (a boolean value, which ONNX
/// computes with only through those ops).
fn refuse_masks(node: &Node, env: &Env, w: &Writer) -> R<()> {
    if MASK_READERS.contains(&node.op()) {
        return Ok(());
    }
    for i in 0..node.p.input.len() {
        if node.input_name(i).is_none() {
            continue;
        }
        if let Value::Dyn(d) = node.input(env, i)? {
            if w.is_mask(d) {
                return Err(node.err(
                    format!("reads the boolean `{}` as a number", d.expr),
                    "memc imports comparison results read by Where, Not, And, Or, Xor, a Cast or a graph output",
                ));
            }
        }
    }
    Ok(())
}

/// A value with `x`'s shape and dim names computed by `expr`.
fn same(x: &Dyn, expr: String) -> R<Out> {
    Ok(Out::Expr(expr, x.shape.clone(), x.syms.clone()))
}

/// The expression and shape of a conv, pool or `Gemm` result.
type Windowed = fn(&Node, &Env, &mut Writer) -> R<(String, Vec<usize>)>;

/// A conv, pool or `Gemm` result, computed by `f`: of its dims only the batch keeps its name.
fn batch_named(node: &Node, env: &Env, w: &mut Writer, f: Windowed) -> R<Out> {
    let sym0 = operand(node, env, w, 0)?.syms.first().cloned().flatten();
    let (expr, shape) = f(node, env, w)?;
    let mut syms = vec![None; shape.len()];
    syms[0] = sym0;
    Ok(Out::Expr(expr, shape, syms))
}

/// One `.mdl` operand: a computed value, or a constant declared as a parameter.
fn operand(node: &Node, env: &Env, w: &mut Writer, i: usize) -> R<Dyn> {
    match node.input(env, i)? {
        Value::Dyn(d) => Ok(d.clone()),
        Value::Const(c) => Ok(w.param(node.input_name(i).unwrap_or("const"), c)),
    }
}

/// Every input as an operand, in order.
fn operands(node: &Node, env: &Env, w: &mut Writer) -> R<Vec<Dyn>> {
    (0..node.p.input.len())
        .map(|i| operand(node, env, w, i))
        .collect()
}

/// `a` or `(a, b)`.
fn pair_text(p: [usize; 2]) -> String {
    if p[0] == p[1] {
        p[0].to_string()
    } else {
        format!("({}, {})", p[0], p[1])
    }
}

fn tuple_text(items: &[String]) -> String {
    match items {
        [one] => one.clone(),
        _ => format!("({})", items.join(", ")),
    }
}

/// The ONNX name a parameter group is called after: the weight's name without `.weight` or
/// a Caffe2 `_w_0` suffix.
fn group_name(node: &Node, i: usize) -> String {
    let n = node.input_name(i).unwrap_or("weight");
    for suffix in [".weight", "_w_0", "_W_0", "_w", "_W"] {
        if let Some(s) = n.strip_suffix(suffix).filter(|s| !s.is_empty()) {
            return s.to_string();
        }
    }
    n.to_string()
}

fn rank_is(node: &Node, d: &Dyn, rank: usize, what: &str) -> R<()> {
    if d.shape.len() != rank {
        return Err(node.err(
            format!("{what} needs a rank-{rank} input, got shape {:?}", d.shape),
            "memc imports 2-D (NCHW) convolutions and 1-D or 2-D pooling",
        ));
    }
    Ok(())
}

/// The broadcast shape of a node's operands and its dim names.
fn broadcast_dyns(node: &Node, ds: &[Dyn]) -> R<(Vec<usize>, Vec<Option<String>>)> {
    let shapes: Vec<&[usize]> = ds.iter().map(|d| &d.shape[..]).collect();
    let out = broadcast_inputs(node, &shapes)?;
    let refs: Vec<&Dyn> = ds.iter().collect();
    let syms = broadcast_syms(&out, &refs);
    Ok((out, syms))
}

/// The dim names of a broadcast result, taken from operands whose dim is not stretched.
fn broadcast_syms(out: &[usize], ds: &[&Dyn]) -> Vec<Option<String>> {
    (0..out.len())
        .map(|k| {
            ds.iter().find_map(|d| {
                let off = out.len().checked_sub(d.shape.len())?;
                let j = k.checked_sub(off)?;
                (d.shape[j] == out[k])
                    .then(|| d.syms.get(j).cloned().flatten())
                    .flatten()
            })
        })
        .collect()
}

/// `reshape(x, (...))` to `shape`, with dim names where the value carries them.
fn reshape_expr(x: &Dyn, shape: &[usize], syms: &[Option<String>]) -> String {
    format!("reshape({}, ({}))", x.expr, shape_text(shape, syms))
}

/// Float attribute `name` (or `default`) as an `.mdl` operand; a non-finite value has no
/// `.mdl` literal and is refused.
pub(super) fn attr_number(node: &Node, name: &str, default: f32) -> R<String> {
    let v = node.float(name, default);
    if !v.is_finite() {
        return Err(node.err(
            format!("attribute `{name}` is {v}"),
            "memc imports finite attribute values",
        ));
    }
    Ok(literal(v))
}

/// A number as an `.mdl` operand, parenthesized when negative.
pub(super) fn literal(v: f32) -> String {
    if v < 0.0 {
        format!("({})", crate::onnx::write::number(v))
    } else {
        crate::onnx::write::number(v)
    }
}
