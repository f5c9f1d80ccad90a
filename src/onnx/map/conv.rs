//! ONNX `Conv` over NCL and NCDHW inputs (the NCHW form is `window.rs`'s, with its
//! asymmetric padding) and `MaxPool` / `AveragePool` over NCDHW, as `.mdl` `conv1d` /
//! `conv3d` and `max_pool3d` / `avg_pool3d` calls, and the weight and bias handling that
//! `ConvTranspose` (`conv_transpose.rs`) shares. Padding must be symmetric per axis:
//! anything else is refused naming the node.

use super::{batch_named, group_name, operand, tuple_text, Out, R};
use crate::onnx::write::Writer;
use crate::onnx::{Env, Node, Value};

/// Maps `node` when it is a `Conv` of rank 3 or 5, a `ConvTranspose` or a pooling of rank 5;
/// `None` otherwise (rank-4 convolutions and pooling are `window.rs`'s).
pub(super) fn map(node: &Node, env: &Env, w: &mut Writer) -> R<Option<Out>> {
    let out = match node.op() {
        "Conv" => {
            let x = operand(node, env, w, 0)?;
            if x.shape.len() == 4 {
                return Ok(None);
            }
            batch_named(node, env, w, conv)
        }
        "ConvTranspose" => batch_named(node, env, w, super::conv_transpose::conv_transpose),
        "MaxPool" | "AveragePool" => {
            if operand(node, env, w, 0)?.shape.len() != 5 {
                return Ok(None);
            }
            batch_named(node, env, w, pool3d)
        }
        _ => return Ok(None),
    };
    out.map(Some)
}

/// `n` positive values of attribute `name` (strides, dilations), each 1 when absent.
fn positive(node: &Node, name: &str, n: usize) -> R<Vec<usize>> {
    match node.ints(name) {
        None => Ok(vec![1; n]),
        Some(v) if v.len() == n && v.iter().all(|&a| a > 0) => {
            Ok(v.iter().map(|&a| a as usize).collect())
        }
        Some(v) => Err(node.err(
            format!("attribute `{name}` = {v:?} is not {n} positive values"),
            "give one positive value per spatial axis",
        )),
    }
}

/// The symmetric padding per axis of `pads` (begins then ends) under `auto_pad` NOTSET or
/// VALID; other modes and unequal begin and end pads are refused.
fn symmetric_pads(node: &Node, n: usize) -> R<Vec<usize>> {
    let auto = node.string("auto_pad").unwrap_or_default();
    match auto.as_str() {
        "" | "NOTSET" => {}
        "VALID" => return Ok(vec![0; n]),
        other => {
            return Err(node.err(
                format!("auto_pad = `{other}` is not supported for {}", node.op()),
                "export with explicit `pads` (NOTSET) or VALID",
            ))
        }
    }
    let Some(p) = node.ints("pads") else {
        return Ok(vec![0; n]);
    };
    if p.len() != 2 * n || p.iter().any(|&v| v < 0) || p[..n] != p[n..] {
        return Err(node.err(
            format!(
                "attribute `pads` = {p:?} is not the same {n} non-negative values at both ends"
            ),
            "memc imports symmetric padding for 1-D and 3-D convolutions and pooling",
        ));
    }
    Ok(p[..n].iter().map(|&v| v as usize).collect())
}

/// One value for every axis when they are equal, else a tuple.
fn axes_text(v: &[usize]) -> String {
    if v.windows(2).all(|p| p[0] == p[1]) {
        v.first().map(usize::to_string).unwrap_or_default()
    } else {
        tuple_text(&v.iter().map(usize::to_string).collect::<Vec<_>>())
    }
}

/// A convolution node's geometry: (spatial rank, groups, strides, dilations).
pub(super) type Geometry = (usize, usize, Vec<usize>, Vec<usize>);

/// The geometry of `node` over input rank `rank` with weight `w` (`[a, b, kernel...]`,
/// channels checked by the caller).
pub(super) fn geometry(node: &Node, rank: usize, w: &[usize]) -> R<Geometry> {
    let n = rank.saturating_sub(2);
    if !(1..=3).contains(&n) || w.len() != rank || w[2..].contains(&0) {
        return Err(node.err(
            format!(
                "input rank {rank} with weight shape {w:?} is not a 1-D, 2-D or 3-D convolution"
            ),
            "memc imports NCL, NCHW and NCDHW convolutions",
        ));
    }
    let groups = usize::try_from(node.int("group", 1)).unwrap_or(0);
    let strides = positive(node, "strides", n)?;
    let dilations = positive(node, "dilations", n)?;
    Ok((n, groups, strides, dilations))
}

/// `call` (a convolution by a weight computed at run time, `o` channels over `spatial`
/// axes) plus the node's bias (input 2) per channel, when it has one.
pub(super) fn plus_bias(
    node: &Node,
    env: &Env,
    w: &mut Writer,
    call: String,
    o: usize,
    spatial: usize,
) -> R<String> {
    if node.input_name(2).is_none() {
        return Ok(call);
    }
    let b = operand(node, env, w, 2)?;
    if b.shape != [o] {
        return Err(node.err(
            format!("bias shape {:?} is not [{o}]", b.shape),
            "the file is malformed",
        ));
    }
    let ones = vec!["1"; spatial].join(", ");
    Ok(format!("{call} + reshape({}, ({o}, {ones}))", b.expr))
}

/// The shape of the node's weight (input 1), constant or computed at run time.
pub(super) fn weight_shape(node: &Node, env: &Env) -> R<Vec<usize>> {
    Ok(match node.input(env, 1)? {
        Value::Dyn(d) => d.shape.clone(),
        Value::Const(c) => c.shape.clone(),
    })
}

/// The call of the `.mdl` function `name` on `x` with the node's weight and bias, and the
/// keyword arguments `(keyword, per-axis values, default)` that differ from their defaults.
/// A constant weight becomes a parameter group (its bias declared with it); a weight
/// computed at run time is passed as a tensor, a bias then added per channel.
pub(super) fn declare_and_call(
    node: &Node,
    env: &Env,
    w: &mut Writer,
    (name, x): (&str, &str),
    groups: usize,
    keywords: &[(&str, &[usize], usize)],
) -> R<String> {
    let shape = weight_shape(node, env)?;
    // The weight is [O, C/g, k...] for a convolution, [C, O/g, k...] when transposed.
    let (c, o) = if name.starts_with("conv_transpose") {
        (shape[0], shape[1] * groups)
    } else {
        (shape[1] * groups, shape[0])
    };
    let mut options = String::new();
    for (keyword, v, default) in keywords {
        if v.iter().any(|x| x != default) {
            options += &format!(", {keyword} = {}", axes_text(v));
        }
    }
    if let Value::Dyn(weight) = node.input(env, 1)? {
        let grouped = if groups == 1 {
            String::new()
        } else {
            format!(", groups = {groups}")
        };
        let call = format!("{name}({x}, {}{grouped}{options})", weight.expr);
        return plus_bias(node, env, w, call, o, shape.len() - 2);
    }
    let wt = node.konst(env, 1)?;
    let mut ctor = format!("{name}({c}, {o}, {}", axes_text(&shape[2..]));
    if groups != 1 {
        ctor += &format!(", groups = {groups}");
    }
    let mut parts = vec![("weight".to_string(), shape.clone(), wt.floats())];
    if node.input_name(2).is_some() {
        let b = node.konst(env, 2)?;
        if b.shape != [o] {
            return Err(node.err(
                format!("bias shape {:?} is not [{o}]", b.shape),
                "the file is malformed",
            ));
        }
        ctor += ", bias = true";
        parts.push(("bias".to_string(), vec![o], b.floats()));
    }
    ctor.push(')');
    let g = w.group(&group_name(node, 1), ctor, parts);
    Ok(format!("{name}({x}, {g}{options})"))
}

fn conv(node: &Node, env: &Env, w: &mut Writer) -> R<(String, Vec<usize>)> {
    let x = operand(node, env, w, 0)?;
    let ws = weight_shape(node, env)?;
    let (n, groups, strides, dilations) = geometry(node, x.shape.len(), &ws)?;
    let pads = symmetric_pads(node, n)?;
    let (c, o, cg) = (x.shape[1], ws[0], ws[1]);
    if groups == 0 || cg * groups != c || o % groups != 0 {
        return Err(node.err(
            format!("{groups} groups do not fit {c} input and {o} output channels"),
            "the file is malformed",
        ));
    }
    let mut out = vec![x.shape[0], o];
    for d in 0..n {
        let span = dilations[d] * (ws[2 + d] - 1) + 1;
        let padded = x.shape[2 + d] + 2 * pads[d];
        if padded < span {
            return Err(node.err(
                format!(
                    "the kernel {:?} does not fit the input {:?}",
                    &ws[2..],
                    x.shape
                ),
                "check the model's input size",
            ));
        }
        out.push((padded - span) / strides[d] + 1);
    }
    let kw = [
        ("stride", &strides[..], 1),
        ("padding", &pads, 0),
        ("dilation", &dilations, 1),
    ];
    let call = declare_and_call(node, env, w, (&format!("conv{n}d"), &x.expr), groups, &kw)?;
    Ok((call, out))
}

fn pool3d(node: &Node, env: &Env, w: &mut Writer) -> R<(String, Vec<usize>)> {
    let x = operand(node, env, w, 0)?;
    let refuse = |what: &str, help: &str| Err(node.err(what.to_string(), help.to_string()));
    if node
        .ints("dilations")
        .is_some_and(|d| d.iter().any(|&v| v != 1))
    {
        return refuse("dilated pooling is not supported", "use dilations of 1");
    }
    if node.int("ceil_mode", 0) != 0 {
        return refuse(
            "ceil_mode is not supported for 3-D pooling",
            "export with ceil_mode = 0",
        );
    }
    if node.p.output.len() > 1 {
        return refuse(
            "MaxPool's Indices output is not supported",
            "use the pooled values only",
        );
    }
    let kernel = match node.ints("kernel_shape").as_deref() {
        Some(k) if k.len() == 3 && k.iter().all(|&v| v > 0) => {
            k.iter().map(|&v| v as usize).collect::<Vec<_>>()
        }
        _ => {
            return refuse(
                "`kernel_shape` must be three positive values",
                "the file is malformed",
            )
        }
    };
    let strides = positive(node, "strides", 3)?;
    let pads = symmetric_pads(node, 3)?;
    let mut out = vec![x.shape[0], x.shape[1]];
    for d in 0..3 {
        let padded = x.shape[2 + d] + 2 * pads[d];
        if padded < kernel[d] || 2 * pads[d] > kernel[d] {
            return refuse(
                "the window does not fit the padded input, or its padding is above half the kernel",
                "check the model's input size and pads",
            );
        }
        out.push((padded - kernel[d]) / strides[d] + 1);
    }
    let is_max = node.op() == "MaxPool";
    let f = if is_max { "max_pool3d" } else { "avg_pool3d" };
    let mut call = format!("{f}({}, {}", x.expr, axes_text(&kernel));
    if strides != kernel {
        call += &format!(", stride = {}", axes_text(&strides));
    }
    if pads.iter().any(|&p| p > 0) {
        call += &format!(", padding = {}", axes_text(&pads));
        if !is_max && node.int("count_include_pad", 0) == 0 {
            call += ", count_pad = false";
        }
    }
    call.push(')');
    Ok((call, out))
}
