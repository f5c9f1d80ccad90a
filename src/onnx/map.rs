//! Maps each run-time ONNX node to `.mdl` expressions with exactly its semantics; constant
//! operands become parameters. Every unsupported op or attribute is a diagnostic.

use super::fold::{
    axes_arg, axis, broadcast, broadcast_inputs, reshape_target, squeezed, transpose_perm,
    unsqueezed,
};
use super::tensor::Const;
use super::write::{number, shape_text, Writer};
use super::{Dyn, Env, Node, Value};
use crate::diagnostic::UserError;
use std::rc::Rc;

type R<T> = Result<T, UserError>;

/// The ops `map` handles (constant-only ops are folded instead), for the help line.
const SUPPORTED: &str = "Conv, Gemm, MatMul, BatchNormalization, Relu, Sigmoid, Tanh, Exp, Log, \
Sqrt, Neg, Erf, Gelu, MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool, LRN, \
LayerNormalization, Softmax, LogSoftmax, Add, Sub, Mul, Div, Sum, Concat, Reshape, Flatten, \
Squeeze, Unsqueeze, Transpose, Split, Pow (x^2), Resize/Upsample (nearest, integer factor), \
Pad (constant, H and W), ReduceMean, ReduceSum, ReduceMax, \
Gather (embedding), Dropout, Identity, Cast (to float), and any op on constants that folding \
evaluates";

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
            "memc imports 2-D (NCHW) convolutions and pooling",
        ));
    }
    Ok(())
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
    let wt = node.konst(env, 1)?;
    let [o, cg, kh, kw] = wt.shape[..] else {
        return Err(node.err(
            format!("weight shape {:?} is not [O, C/groups, KH, KW]", wt.shape),
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
    let mut call = format!("conv2d({}, {g}", x.expr);
    for (name, v) in [("stride", stride), ("dilation", dilation)] {
        if v != [1; 2] {
            call += &format!(", {name} = {}", pair_text(v));
        }
    }
    if p != [0; 4] {
        call += &format!(", padding = {}", pads_text(p));
    }
    call.push(')');
    Ok((call, vec![x.shape[0], o, out[0], out[1]]))
}

fn pool(node: &Node, env: &Env, w: &mut Writer) -> R<(String, Vec<usize>)> {
    let x = operand(node, env, w, 0)?;
    rank_is(node, &x, 4, node.op())?;
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

fn batchnorm(node: &Node, env: &Env, w: &mut Writer, base: &str) -> R<(String, Vec<usize>)> {
    if node.int("training_mode", 0) != 0 {
        return Err(node.err(
            "training-mode batch normalization is not supported",
            "export the model in eval mode (`model.eval()`)",
        ));
    }
    let x = operand(node, env, w, 0)?;
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
        &Const::new(shape.clone(), super::tensor::Data::Float(scale)),
    );
    let t = w.param(
        &format!("{base}_shift"),
        &Const::new(shape, super::tensor::Data::Float(shift)),
    );
    Ok((format!("{} * {} + {}", x.expr, s.expr, t.expr), x.shape))
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
                &Const::new(cv.shape.clone(), super::tensor::Data::Float(scaled)),
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

/// Binary arithmetic; a one-element constant that does not widen the result is written as
/// a number (exact for + - *), others as parameters.
fn arithmetic(
    node: &Node,
    env: &Env,
    w: &mut Writer,
    op: &str,
) -> R<(String, Vec<usize>, Vec<Option<String>>)> {
    let sym = match op {
        "Add" => "+",
        "Sub" => "-",
        "Mul" => "*",
        _ => "/",
    };
    let literal = |i: usize| -> Option<String> {
        match node.input(env, i).ok()? {
            Value::Const(c) if c.data.len() == 1 && op != "Div" => {
                let v = c.floats()[0];
                v.is_finite().then(|| number(v)).map(|s| (s, c.shape.len()))
            }
            _ => None,
        }
        .and_then(|(s, rank)| {
            let other = match node.input(env, 1 - i).ok()? {
                Value::Dyn(d) => d.shape.len(),
                Value::Const(_) => return None,
            };
            (rank <= other).then_some(s)
        })
    };
    let mut texts = Vec::new();
    let mut dyns = Vec::new();
    for i in 0..2 {
        match literal(i) {
            Some(s) => texts.push(s),
            None => {
                let d = operand(node, env, w, i)?;
                texts.push(d.expr.clone());
                dyns.push(d);
            }
        }
    }
    let (out, syms) = broadcast_dyns(node, &dyns)?;
    Ok((format!("{} {sym} {}", texts[0], texts[1]), out, syms))
}

/// `Split` into `slice`s: sizes from the `split` attribute (input 1 from opset 13), else equal
/// parts, one per output.
fn split(node: &Node, env: &Env, w: &mut Writer) -> R<Vec<Value>> {
    let x = operand(node, env, w, 0)?;
    let ax = axis(node, node.int("axis", 0), x.shape.len())?;
    let outs = node.p.output.len();
    let sizes: Vec<i64> = match node.opset {
        o if o < 13 => node.ints("split").unwrap_or_default(),
        _ if node.input_name(1).is_some() => node.konst(env, 1)?.ints(),
        _ => Vec::new(),
    };
    let extent = x.shape[ax];
    let sizes: Vec<usize> = if sizes.is_empty() {
        let part = extent.div_ceil(outs.max(1));
        (0..outs)
            .map(|i| part.min(extent.saturating_sub(i * part)))
            .collect()
    } else {
        sizes
            .iter()
            .map(|&s| usize::try_from(s).unwrap_or(usize::MAX))
            .collect()
    };
    if sizes.len() != outs
        || sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s)) != Some(extent)
    {
        return Err(node.err(
            format!("sizes {sizes:?} do not split {extent} elements into {outs} outputs"),
            "the file is malformed",
        ));
    }
    let mut start = 0;
    let mut values = Vec::new();
    for (name, size) in node.p.output.iter().zip(sizes) {
        let mut shape = x.shape.clone();
        shape[ax] = size;
        let mut syms = x.syms.clone();
        syms[ax] = None;
        let expr = format!("slice({}, {start}, {}, axis = {ax})", x.expr, start + size);
        values.push(Value::Dyn(w.bind(name, expr, shape, syms)));
        start += size;
    }
    Ok(values)
}

/// `(top, left, bottom, right)` and the fill value of a constant-mode `Pad` of H and W.
fn pad_args(node: &Node, env: &Env) -> R<([usize; 4], f32)> {
    let refuse = |what: String| {
        node.err(
            what,
            "memc imports constant padding of H and W (NCHW) by non-negative amounts",
        )
    };
    let mode = node.string("mode").unwrap_or_else(|| "constant".into());
    if mode != "constant" {
        return Err(refuse(format!("mode `{mode}` is not supported")));
    }
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

/// The integer factor of a nearest-neighbour `Resize`/`Upsample` that repeats each pixel
/// `f x f` times (N and C unscaled), or a diagnostic for anything that is not exactly that.
fn upsample_factor(node: &Node, env: &Env, shape: &[usize]) -> R<usize> {
    let refuse = |what: String| {
        node.err(
            what,
            "memc imports nearest-neighbour upsampling of H and W by one integer factor",
        )
    };
    let mode = node.string("mode").unwrap_or_else(|| "nearest".into());
    if mode != "nearest" {
        return Err(refuse(format!("mode `{mode}` is not supported")));
    }
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

/// Maps `node` to `.mdl` statements; returns its output values.
pub(super) fn map(node: &Node, env: &Env, w: &mut Writer) -> R<Vec<Value>> {
    let out_name = node.p.output.first().cloned().unwrap_or_default();
    let base = if node.p.name.is_empty() {
        out_name.clone()
    } else {
        node.p.name.clone()
    };
    let op = node.op();
    let same = |d: &Dyn, expr: String| (expr, d.shape.clone(), d.syms.clone());
    let (expr, shape, syms) = match op {
        "Relu" | "Sigmoid" | "Tanh" | "Exp" | "Log" | "Sqrt" | "Neg" | "Erf" => {
            let x = operand(node, env, w, 0)?;
            same(&x, format!("{}({})", op.to_lowercase(), x.expr))
        }
        "Gelu" => {
            let x = operand(node, env, w, 0)?;
            let exact = match node.string("approximate").as_deref() {
                None | Some("none") => ", exact = true",
                Some("tanh") => "",
                Some(other) => {
                    return Err(node.err(
                        format!("approximate = `{other}` is unknown"),
                        "use none or tanh",
                    ))
                }
            };
            same(&x, format!("gelu({}{exact})", x.expr))
        }
        "Identity" | "Dropout" | "Cast" => {
            if op == "Cast" && !matches!(node.int("to", 0), 1 | 11) {
                return Err(node.err(
                    format!(
                        "casts a computed value to {}",
                        super::tensor::dtype_name(node.int("to", 0) as i32)
                    ),
                    "memc computes in float32; only casts to float are imported",
                ));
            }
            if op == "Dropout" && node.input_name(2).is_some() {
                let training = node.konst(env, 2)?.ints().first().copied().unwrap_or(0);
                if training != 0 {
                    return Err(node.err(
                        "training-mode dropout is not supported",
                        "export in eval mode",
                    ));
                }
            }
            return Ok(vec![Value::Dyn(operand(node, env, w, 0)?)]);
        }
        "Add" | "Sub" | "Mul" | "Div" => arithmetic(node, env, w, op)?,
        "Sum" => {
            let mut ds = operands(node, env, w)?;
            if ds.len() <= 1 {
                return ds
                    .pop()
                    .map(|d| vec![Value::Dyn(d)])
                    .ok_or_else(|| node.err("has no inputs", "the file is malformed"));
            }
            let (out, syms) = broadcast_dyns(node, &ds)?;
            let terms: Vec<&str> = ds.iter().map(|d| d.expr.as_str()).collect();
            (terms.join(" + "), out, syms)
        }
        "Conv" | "MaxPool" | "AveragePool" | "BatchNormalization" | "Gemm" => {
            let sym0 = operand(node, env, w, 0)?.syms.first().cloned().flatten();
            let (expr, shape) = match op {
                "Conv" => conv(node, env, w)?,
                "BatchNormalization" => batchnorm(node, env, w, &base)?,
                "Gemm" => gemm(node, env, w)?,
                _ => pool(node, env, w)?,
            };
            let mut syms = vec![None; shape.len()];
            syms[0] = sym0;
            if op == "BatchNormalization" {
                syms = operand(node, env, w, 0)?.syms;
            }
            (expr, shape, syms)
        }
        "GlobalAveragePool" | "GlobalMaxPool" => {
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
            (
                format!(
                    "{f}({}, axis = {}, keepdim = true)",
                    x.expr,
                    tuple_text(&axes)
                ),
                shape,
                syms,
            )
        }
        "ReduceMean" | "ReduceSum" | "ReduceMax" => {
            let x = operand(node, env, w, 0)?;
            let from_input = node.opset >= if op == "ReduceSum" { 13 } else { 18 };
            let axes = if from_input {
                match node.input_name(1) {
                    Some(_) => Some(node.konst(env, 1)?.ints()),
                    None => None,
                }
            } else {
                node.ints("axes")
            };
            let rank = x.shape.len();
            let axes: Vec<usize> = match axes.filter(|a| !a.is_empty()) {
                Some(a) => a.iter().map(|&v| axis(node, v, rank)).collect::<R<_>>()?,
                None => (0..rank).collect(),
            };
            let keep = node.int("keepdims", 1) != 0;
            let f = &op[6..].to_lowercase();
            let items: Vec<String> = axes.iter().map(usize::to_string).collect();
            let mut shape = Vec::new();
            let mut syms = Vec::new();
            for k in 0..rank {
                if !axes.contains(&k) {
                    shape.push(x.shape[k]);
                    syms.push(x.syms[k].clone());
                } else if keep {
                    shape.push(1);
                    syms.push(None);
                }
            }
            (
                format!(
                    "{f}({}, axis = {}, keepdim = {keep})",
                    x.expr,
                    tuple_text(&items)
                ),
                shape,
                syms,
            )
        }
        "LRN" => {
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
        "LayerNormalization" => {
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
        "Softmax" | "LogSoftmax" => {
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
        "Concat" => {
            let ds = operands(node, env, w)?;
            let Some(rank) = ds.first().map(|d| d.shape.len()) else {
                return Err(node.err("has no inputs", "the file is malformed"));
            };
            let ax = axis(node, node.int("axis", 0), rank)?;
            let mut shape = ds[0].shape.clone();
            for d in &ds[1..] {
                let same_rest =
                    d.shape.len() == rank && (0..rank).all(|k| k == ax || d.shape[k] == shape[k]);
                if !same_rest {
                    return Err(node.err(
                        format!(
                            "input shapes {:?} and {:?} do not concatenate",
                            ds[0].shape, d.shape
                        ),
                        "the file is malformed",
                    ));
                }
                shape[ax] += d.shape[ax];
            }
            let mut syms = ds[0].syms.clone();
            syms[ax] = None;
            let parts: Vec<&str> = ds.iter().map(|d| d.expr.as_str()).collect();
            (
                format!("concat({}, axis = {ax})", parts.join(", ")),
                shape,
                syms,
            )
        }
        "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" => {
            let x = operand(node, env, w, 0)?;
            let (shape, syms) = match op {
                "Reshape" => {
                    let t = node.konst(env, 1)?;
                    let target = t.ints();
                    let shape = reshape_target(node, &x.shape, &target)?;
                    let syms = (0..shape.len())
                        .map(|i| match t.dim_of(i) {
                            Some(d) => Some(d.to_string()),
                            None if target[i] == 0 => x.syms.get(i).cloned().flatten(),
                            None => None,
                        })
                        .collect();
                    (shape, syms)
                }
                "Flatten" => {
                    let ax = axis(node, node.int("axis", 1), x.shape.len() + 1)?;
                    let lead = if ax == 1 { x.syms[0].clone() } else { None };
                    (
                        vec![
                            x.shape[..ax].iter().product(),
                            x.shape[ax..].iter().product(),
                        ],
                        vec![lead, None],
                    )
                }
                "Squeeze" => {
                    let shape = squeezed(node, &x.shape, axes_arg(node, env)?.as_deref())?;
                    (shape.clone(), vec![None; shape.len()])
                }
                _ => {
                    let axes = axes_arg(node, env)?.unwrap_or_default();
                    let shape = unsqueezed(node, &x.shape, &axes)?;
                    (shape.clone(), vec![None; shape.len()])
                }
            };
            if shape == x.shape {
                return Ok(vec![Value::Dyn(x)]);
            }
            if shape.is_empty() {
                return Err(node.err(
                    "reshapes to a scalar",
                    "memc values used by later ops have rank 1 or more",
                ));
            }
            (reshape_expr(&x, &shape, &syms), shape, syms)
        }
        "Transpose" => {
            let x = operand(node, env, w, 0)?;
            let rank = x.shape.len();
            let perm = transpose_perm(node, rank)?;
            if perm.iter().enumerate().all(|(i, &p)| i == p) {
                return Ok(vec![Value::Dyn(x)]);
            }
            let items: Vec<String> = perm.iter().map(usize::to_string).collect();
            let shape = perm.iter().map(|&p| x.shape[p]).collect();
            let syms = perm.iter().map(|&p| x.syms[p].clone()).collect();
            (
                format!("permute({}, ({}))", x.expr, items.join(", ")),
                shape,
                syms,
            )
        }
        "MatMul" => {
            let a = operand(node, env, w, 0)?;
            let b = operand(node, env, w, 1)?;
            let shape = matmul(node, &a, &b)?;
            let syms = broadcast_syms(&shape[..shape.len() - 2], &[&a, &b])
                .into_iter()
                .chain([a.syms[a.shape.len() - 2].clone(), None])
                .collect();
            (format!("{} @ {}", a.expr, b.expr), shape, syms)
        }
        "Split" => return split(node, env, w),
        "Pad" => {
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
            (
                format!(
                    "pad({}, ({}, {}, {}, {}){v})",
                    x.expr, p[0], p[1], p[2], p[3]
                ),
                shape,
                syms,
            )
        }
        "Resize" | "Upsample" => {
            let x = operand(node, env, w, 0)?;
            rank_is(node, &x, 4, op)?;
            let f = upsample_factor(node, env, &x.shape)?;
            let shape = vec![x.shape[0], x.shape[1], x.shape[2] * f, x.shape[3] * f];
            let mut syms = vec![None; 4];
            syms[..2].clone_from_slice(&x.syms[..2]);
            (format!("upsample({}, {f})", x.expr), shape, syms)
        }
        "Pow" => {
            let x = operand(node, env, w, 0)?;
            let e = node.konst(env, 1)?;
            if e.data.len() != 1 || e.data.get(0) != 2.0 {
                return Err(node.err(
                    "raises to a power other than a constant 2",
                    "memc imports Pow(x, 2) as x * x",
                ));
            }
            same(&x, format!("{} * {}", x.expr, x.expr))
        }
        "Gather" => {
            let table = node.konst(env, 0).map_err(|_| {
                node.err(
                    "gathers from a computed tensor",
                    "memc imports Gather as an embedding lookup from a constant table",
                )
            })?;
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
            (format!("embed({}, {})", t.expr, ids.expr), shape, syms)
        }
        _ => {
            return Err(node.err(
                format!("operator `{op}` is not supported"),
                format!("memc imports {SUPPORTED}"),
            ))
        }
    };
    Ok(vec![Value::Dyn(w.bind(&out_name, expr, shape, syms))])
}
