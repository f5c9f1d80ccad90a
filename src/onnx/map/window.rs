//! ONNX ops over NCHW windows as `.mdl` expressions: convolution (of a constant weight as a
//! `conv2d` group, of a computed one as the tensor form of `conv2d`), pooling (windowed and
//! global; a 1-D pool as a 2-D one of height 1), batch normalization, LRN, `Pad` and
//! nearest-neighbour `Resize`/`Upsample`.

use super::{batch_named, group_name, operand, pair_text, rank_is, same, tuple_text, Out, R};
use crate::diagnostic::UserError;
use crate::onnx::tensor::Const;
use crate::onnx::write::{number, shape_text, Writer};
use crate::onnx::{Dyn, Env, Node, Value};
use std::rc::Rc;

/// Maps `node` when it is a windowed or per-channel op over NCHW; `None` for other ops.
pub(super) fn map(node: &Node, env: &Env, w: &mut Writer) -> R<Option<Out>> {
    let out = match node.op() {
        "Conv" => batch_named(node, env, w, conv),
        "MaxPool" | "AveragePool" => match node.input(env, 0)? {
            Value::Dyn(x) if x.shape.len() == 3 => pool_1d(node, x),
            _ => batch_named(node, env, w, pool),
        },
        "BatchNormalization" => batchnorm(node, env, w),
        "InstanceNormalization" => super::instance_norm::instance_norm(node, env, w),
        "GlobalAveragePool" | "GlobalMaxPool" => global_pool(node, env, w),
        "LRN" => lrn(node, env, w),
        "Pad" => pad(node, env, w),
        // One integer factor repeats elements exactly; every other resize is a matmul.
        "Resize" | "Upsample" => {
            upsample(node, env, w).or_else(|_| super::resize::resize(node, env, w))
        }
        _ => return Ok(None),
    };
    out.map(Some)
}

/// Two positive values of a per-axis attribute (strides, dilations), defaulting to 1.
fn two(node: &Node, name: &str) -> R<[usize; 2]> {
    match node.ints(name).as_deref() {
        None => Ok([1; 2]),
        Some(&[a, b]) if a > 0 && b > 0 => Ok([a as usize, b as usize]),
        Some(v) => Err(node.err(
            format!("attribute `{name}` = {v:?} is not two positive values"),
            "memc imports 2-D convolutions and pooling",
        )),
    }
}

/// The `(top, left, bottom, right)` padding of a conv or pool over `input` (H, W), from
/// `pads` or `auto_pad`, plus the extra bottom/right rows `ceil_mode` needs.
fn pads(node: &Node, input: [usize; 2], window: [usize; 2], stride: [usize; 2]) -> R<[usize; 4]> {
    let auto = node.string("auto_pad").unwrap_or_default();
    let mut p = match auto.as_str() {
        "" | "NOTSET" => match node.ints("pads").as_deref() {
            None => [0; 4],
            Some(&[t, l, b, r]) if [t, l, b, r].iter().all(|&x| x >= 0) => {
                [t as usize, l as usize, b as usize, r as usize]
            }
            Some(v) => {
                return Err(node.err(
                    format!("attribute `pads` = {v:?} is not four non-negative values"),
                    "memc imports 2-D convolutions and pooling",
                ))
            }
        },
        "VALID" => [0; 4],
        "SAME_UPPER" | "SAME_LOWER" => {
            let mut p = [0; 4];
            for k in 0..2 {
                let out = input[k].div_ceil(stride[k]);
                let total = ((out - 1) * stride[k] + window[k]).saturating_sub(input[k]);
                let small = total / 2;
                let (before, after) = if auto == "SAME_UPPER" {
                    (small, total - small)
                } else {
                    (total - small, small)
                };
                p[k] = before;
                p[k + 2] = after;
            }
            p
        }
        other => {
            return Err(node.err(
                format!("auto_pad = `{other}` is not an ONNX padding mode"),
                "use NOTSET, VALID, SAME_UPPER or SAME_LOWER",
            ))
        }
    };
    if node.int("ceil_mode", 0) != 0 {
        for k in 0..2 {
            let span = input[k] + p[k] + p[k + 2];
            let mut out = span.saturating_sub(window[k]).div_ceil(stride[k]) + 1;
            if (out - 1) * stride[k] >= input[k] + p[k] {
                out -= 1;
            }
            p[k + 2] += ((out - 1) * stride[k] + window[k]).saturating_sub(span);
        }
    }
    Ok(p)
}

fn pads_text(p: [usize; 4]) -> String {
    if p[0] == p[2] && p[1] == p[3] {
        pair_text([p[0], p[1]])
    } else {
        format!("({}, {}, {}, {})", p[0], p[1], p[2], p[3])
    }
}

/// Spatial output size of a window sweep, or an error when the window does not fit.
fn swept(
    node: &Node,
    input: [usize; 2],
    p: [usize; 4],
    window: [usize; 2],
    stride: [usize; 2],
) -> R<[usize; 2]> {
    let mut out = [0; 2];
    for k in 0..2 {
        let span = input[k] + p[k] + p[k + 2];
        if span < window[k] || stride[k] == 0 {
            return Err(node.err(
                format!("a window of {window:?} does not fit the padded input {input:?}"),
                "check the model's input size",
            ));
        }
        out[k] = (span - window[k]) / stride[k] + 1;
    }
    Ok(out)
}

fn conv(node: &Node, env: &Env, w: &mut Writer) -> R<(String, Vec<usize>)> {
    let x = operand(node, env, w, 0)?;
    rank_is(node, &x, 4, "Conv")?;
    let computed = match node.input(env, 1)? {
        Value::Dyn(d) => Some(d.clone()),
        Value::Const(_) => None,
    };
    let wshape = match &computed {
        Some(d) => d.shape.clone(),
        None => node.konst(env, 1)?.shape.clone(),
    };
    let [o, cg, kh, kw] = wshape[..] else {
        return Err(node.err(
            format!("weight shape {wshape:?} is not [O, C/groups, KH, KW]"),
            "memc imports 2-D convolutions",
        ));
    };
    if kh == 0 || kw == 0 {
        return Err(node.err("the kernel is empty", "the file is malformed"));
    }
    let groups = usize::try_from(node.int("group", 1)).unwrap_or(0);
    let c = x.shape[1];
    if groups == 0 || cg * groups != c || o % groups != 0 {
        return Err(node.err(
            format!("{groups} groups do not fit {c} input and {o} output channels"),
            "the file is malformed",
        ));
    }
    let stride = two(node, "strides")?;
    let dilation = two(node, "dilations")?;
    let span = [dilation[0] * (kh - 1) + 1, dilation[1] * (kw - 1) + 1];
    let input = [x.shape[2], x.shape[3]];
    let p = pads(node, input, span, stride)?;
    let out = swept(node, input, p, span, stride)?;
    let mut options = String::new();
    for (name, v) in [("stride", stride), ("dilation", dilation)] {
        if v != [1; 2] {
            options += &format!(", {name} = {}", pair_text(v));
        }
    }
    if p != [0; 4] {
        options += &format!(", padding = {}", pads_text(p));
    }
    let shape = vec![x.shape[0], o, out[0], out[1]];
    if let Some(weight) = computed {
        // A weight computed at run time: the tensor form of `conv2d`, the bias added per channel.
        if groups != 1 {
            options += &format!(", groups = {groups}");
        }
        let call = format!("conv2d({}, {}{options})", x.expr, weight.expr);
        return Ok((super::conv::plus_bias(node, env, w, call, o, 2)?, shape));
    }
    let wt = node.konst(env, 1)?;
    let bias = match node.input_name(2) {
        Some(_) => Some(node.konst(env, 2)?),
        None => None,
    };
    let mut ctor = format!("conv2d({c}, {o}, {}", pair_text([kh, kw]));
    if groups != 1 {
        ctor += &format!(", groups = {groups}");
    }
    let mut parts = vec![("weight".to_string(), wt.shape.clone(), wt.floats())];
    if let Some(b) = bias {
        ctor += ", bias = true";
        parts.push(("bias".to_string(), vec![o], b.floats()));
    }
    ctor.push(')');
    let g = w.group(&group_name(node, 1), ctor, parts);
    Ok((format!("conv2d({}, {g}{options})", x.expr), shape))
}

fn pool(node: &Node, env: &Env, w: &mut Writer) -> R<(String, Vec<usize>)> {
    let x = operand(node, env, w, 0)?;
    pool_of(node, &x)
}

/// A 1-D pool over `[N, C, L]`: the 2-D pool of `[N, C, 1, L]` with a window of height 1
/// (each per-axis attribute given a leading 1, `pads` a leading 0 on each side).
fn pool_1d(node: &Node, x: &Dyn) -> R<Out> {
    let mut lifted = node.p.clone();
    for a in &mut lifted.attribute {
        match (a.name.as_str(), a.ints.len()) {
            ("kernel_shape" | "strides" | "dilations", 1) => a.ints.insert(0, 1),
            ("pads", 2) => a.ints = vec![0, a.ints[0], 0, a.ints[1]],
            _ => {}
        }
    }
    let node = Node {
        p: &lifted,
        opset: node.opset,
        index: node.index,
    };
    let (n, c, l) = (x.shape[0], x.shape[1], x.shape[2]);
    let syms4 = [
        x.syms[0].clone(),
        x.syms[1].clone(),
        None,
        x.syms[2].clone(),
    ];
    let x4 = Dyn {
        expr: format!(
            "reshape({}, ({}))",
            x.expr,
            shape_text(&[n, c, 1, l], &syms4)
        ),
        shape: vec![n, c, 1, l],
        syms: syms4.to_vec(),
    };
    let (call, shape) = pool_of(&node, &x4)?;
    let out = vec![n, c, shape[3]];
    let syms = vec![x.syms[0].clone(), None, None];
    let expr = format!("reshape({call}, ({}))", shape_text(&out, &syms));
    Ok(Out::Expr(expr, out, syms))
}

/// A 2-D `MaxPool` or `AveragePool` of `x`.
fn pool_of(node: &Node, x: &Dyn) -> R<(String, Vec<usize>)> {
    rank_is(node, x, 4, node.op())?;
    if node
        .ints("dilations")
        .is_some_and(|d| d.iter().any(|&v| v != 1))
    {
        return Err(node.err("dilated pooling is not supported", "use dilations of 1"));
    }
    let kernel = match node.ints("kernel_shape").as_deref() {
        Some(&[a, b]) if a > 0 && b > 0 => [a as usize, b as usize],
        _ => {
            return Err(node.err(
                "`kernel_shape` must be two positive values",
                "memc imports 2-D pooling",
            ))
        }
    };
    let stride = two(node, "strides")?;
    let input = [x.shape[2], x.shape[3]];
    let is_max = node.op() == "MaxPool";
    let count_pad = node.int("count_include_pad", 0) != 0;
    if node.int("ceil_mode", 0) != 0 && !is_max && count_pad {
        return Err(node.err(
            "ceil_mode with count_include_pad = 1 is not supported",
            "export with ceil_mode = 0 or count_include_pad = 0",
        ));
    }
    let p = pads(node, input, kernel, stride)?;
    let out = swept(node, input, p, kernel, stride)?;
    let f = if is_max { "max_pool2d" } else { "avg_pool2d" };
    let mut call = format!("{f}({}, {}", x.expr, pair_text(kernel));
    if stride != kernel {
        call += &format!(", stride = {}", pair_text(stride));
    }
    if p != [0; 4] {
        call += &format!(", padding = {}", pads_text(p));
        if !is_max && !count_pad {
            call += ", count_pad = false";
        }
    }
    call.push(')');
    Ok((call, vec![x.shape[0], x.shape[1], out[0], out[1]]))
}

/// Eval-mode `BatchNormalization` as a per-channel scale and shift, named after the node
/// (or its output).
fn batchnorm(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
    let x = operand(node, env, w, 0)?;
    if node.int("training_mode", 0) != 0 {
        return Err(node.err(
            "training-mode batch normalization is not supported",
            "export the model in eval mode (`model.eval()`)",
        ));
    }
    let base = if node.p.name.is_empty() {
        node.p.output.first().cloned().unwrap_or_default()
    } else {
        node.p.name.clone()
    };
    let c = x.shape.get(1).copied().unwrap_or(0);
    let eps = f64::from(node.float("epsilon", 1e-5));
    let mut v = Vec::new();
    for i in 1..5 {
        let k = node.konst(env, i)?;
        if k.shape != [c] {
            return Err(node.err(
                format!("input {i} has shape {:?}, expected [{c}]", k.shape),
                "the file is malformed",
            ));
        }
        v.push(k.floats());
    }
    let scale: Vec<f32> = (0..c)
        .map(|i| (f64::from(v[0][i]) / (f64::from(v[3][i]) + eps).sqrt()) as f32)
        .collect();
    let shift: Vec<f32> = (0..c)
        .map(|i| (f64::from(v[1][i]) - f64::from(v[2][i]) * f64::from(scale[i])) as f32)
        .collect();
    let mut shape = vec![c];
    shape.resize(x.shape.len().saturating_sub(1), 1);
    let s = w.param(
        &format!("{base}_scale"),
        &Const::new(shape.clone(), crate::onnx::tensor::Data::Float(scale)),
    );
    let t = w.param(
        &format!("{base}_shift"),
        &Const::new(shape, crate::onnx::tensor::Data::Float(shift)),
    );
    Ok(Out::Expr(
        format!("{} * {} + {}", x.expr, s.expr, t.expr),
        x.shape,
        x.syms,
    ))
}

/// `GlobalAveragePool` / `GlobalMaxPool`: the mean or max over the spatial dims, kept.
fn global_pool(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
    let op = node.op();
    let x = operand(node, env, w, 0)?;
    if x.shape.len() < 3 {
        return Err(node.err("needs an input with spatial dims", "the file is malformed"));
    }
    let axes: Vec<String> = (2..x.shape.len()).map(|a| a.to_string()).collect();
    let f = if op == "GlobalMaxPool" { "max" } else { "mean" };
    let mut shape = x.shape.clone();
    shape[2..].fill(1);
    let mut syms = x.syms.clone();
    syms[2..].fill(None);
    Ok(Out::Expr(
        format!(
            "{f}({}, axis = {}, keepdim = true)",
            x.expr,
            tuple_text(&axes)
        ),
        shape,
        syms,
    ))
}

/// `LRN` across channels.
fn lrn(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
    let x = operand(node, env, w, 0)?;
    rank_is(node, &x, 4, "LRN")?;
    let size = node.int("size", 0);
    if size <= 0 {
        return Err(node.err("`size` must be positive", "the file is malformed"));
    }
    let expr = format!(
        "lrn({}, size = {size}, alpha = {}, beta = {}, bias = {})",
        x.expr,
        number(node.float("alpha", 1e-4)),
        number(node.float("beta", 0.75)),
        number(node.float("bias", 1.0))
    );
    same(&x, expr)
}

/// Constant-mode `Pad` of H and W.
fn pad(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
    let x = operand(node, env, w, 0)?;
    rank_is(node, &x, 4, "Pad")?;
    let (p, value) = pad_args(node, env)?;
    let v = if value == 0.0 {
        String::new()
    } else {
        format!(", value = {}", number(value))
    };
    let shape = vec![
        x.shape[0],
        x.shape[1],
        x.shape[2] + p[0] + p[2],
        x.shape[3] + p[1] + p[3],
    ];
    let mut syms = vec![None; 4];
    syms[..2].clone_from_slice(&x.syms[..2]);
    Ok(Out::Expr(
        format!(
            "pad({}, ({}, {}, {}, {}){v})",
            x.expr, p[0], p[1], p[2], p[3]
        ),
        shape,
        syms,
    ))
}

/// Checks that the `mode` attribute (default `want`) is `want`, refusing with `help`
/// otherwise; returns the refusal for the node's other attributes.
fn mode_refusal<'a>(
    node: &'a Node,
    want: &str,
    help: &'static str,
) -> R<impl Fn(String) -> UserError + 'a> {
    let refuse = move |what: String| node.err(what, help);
    let mode = node.string("mode").unwrap_or_else(|| want.into());
    if mode != want {
        return Err(refuse(format!("mode `{mode}` is not supported")));
    }
    Ok(refuse)
}

/// `(top, left, bottom, right)` and the fill value of a constant-mode `Pad` of H and W.
fn pad_args(node: &Node, env: &Env) -> R<([usize; 4], f32)> {
    let refuse = mode_refusal(
        node,
        "constant",
        "memc imports constant padding of H and W (NCHW) by non-negative amounts",
    )?;
    let (pads, value) = if node.opset < 11 {
        (
            node.ints("pads").unwrap_or_default(),
            node.float("value", 0.0),
        )
    } else {
        if node.input_name(3).is_some() {
            return Err(refuse("the `axes` input is not supported".into()));
        }
        let value = match node.input_name(2) {
            Some(_) => node.konst(env, 2)?.floats().first().copied().unwrap_or(0.0),
            None => 0.0,
        };
        (node.konst(env, 1)?.ints(), value)
    };
    match pads[..] {
        [0, 0, t, l, 0, 0, b, r] if [t, l, b, r].iter().all(|&v| v >= 0) && value.is_finite() => {
            Ok(([t as usize, l as usize, b as usize, r as usize], value))
        }
        _ => Err(refuse(format!("pads {pads:?} with value {value}"))),
    }
}

/// Nearest-neighbour `Resize`/`Upsample` by one integer factor.
fn upsample(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
    let op = node.op();
    let x = operand(node, env, w, 0)?;
    rank_is(node, &x, 4, op)?;
    let f = upsample_factor(node, env, &x.shape)?;
    let shape = vec![x.shape[0], x.shape[1], x.shape[2] * f, x.shape[3] * f];
    let mut syms = vec![None; 4];
    syms[..2].clone_from_slice(&x.syms[..2]);
    Ok(Out::Expr(format!("upsample({}, {f})", x.expr), shape, syms))
}

/// The integer factor of a nearest-neighbour `Resize`/`Upsample` that repeats each pixel
/// `f x f` times (N and C unscaled), or a diagnostic for anything that is not exactly that.
fn upsample_factor(node: &Node, env: &Env, shape: &[usize]) -> R<usize> {
    let refuse = mode_refusal(
        node,
        "nearest",
        "memc imports nearest-neighbour upsampling of H and W by one integer factor",
    )?;
    let scales: Vec<f64> = match (node.op(), node.opset) {
        ("Upsample", o) if o < 9 => node
            .attr("scales")
            .map(|a| a.floats.iter().map(|&v| f64::from(v)).collect())
            .unwrap_or_default(),
        ("Resize", o) if o >= 11 => {
            let from = |i: usize| -> R<Option<Rc<Const>>> {
                match node.input_name(i) {
                    Some(_) => node.konst(env, i).map(|c| Some(c.clone())),
                    None => Ok(None),
                }
            };
            match (from(2)?.filter(|c| c.data.len() > 0), from(3)?) {
                (Some(s), _) => s.floats().iter().map(|&v| f64::from(v)).collect(),
                (None, Some(sizes)) => sizes
                    .ints()
                    .iter()
                    .zip(shape)
                    .map(|(&o, &i)| o as f64 / i as f64)
                    .collect(),
                (None, None) => Vec::new(),
            }
        }
        _ => node
            .konst(env, 1)?
            .floats()
            .iter()
            .map(|&v| f64::from(v))
            .collect(),
    };
    let f = scales.get(2).copied().unwrap_or(0.0);
    if scales.len() != 4
        || scales[0] != 1.0
        || scales[1] != 1.0
        || scales[3] != f
        || f < 1.0
        || f.fract() != 0.0
    {
        return Err(refuse(format!(
            "scales {scales:?} are not (1, 1, f, f) with an integer f"
        )));
    }
    let f = f as usize;
    // Which source pixel each output pixel reads must be floor(x / f).
    let coord = node
        .string("coordinate_transformation_mode")
        .unwrap_or_else(|| "half_pixel".into());
    let nearest = node
        .string("nearest_mode")
        .unwrap_or_else(|| "round_prefer_floor".into());
    let exact = node.op() == "Upsample"
        || match coord.as_str() {
            "half_pixel" | "pytorch_half_pixel" => nearest != "floor" && nearest != "ceil",
            "asymmetric" => nearest == "floor" || (nearest == "round_prefer_floor" && f <= 2),
            _ => false,
        };
    if !exact {
        return Err(refuse(format!(
            "coordinate_transformation_mode `{coord}` with nearest_mode `{nearest}` does not repeat pixels"
        )));
    }
    Ok(f)
}
