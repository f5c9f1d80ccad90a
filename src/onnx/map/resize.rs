//! ONNX `Resize` and `Upsample` in the forms `upsample` (nearest by one integer factor,
//! `window.rs`) does not compute: nearest by any scale, linear and cubic (`cubic_coeff_a`,
//! `exclude_outside`, `antialias`), every coordinate transformation but
//! `tf_crop_and_resize`, scales constant or computed at run time.
//!
//! Each resized axis (of the last two) is a matrix `W[out, in]` of ONNX's interpolation
//! coefficients, built in the model from the axis's scale and applied by a matmul:
//! `W_h @ x @ transpose(W_w)`. Coefficient `(i, j)` is the kernel at `(j - x_i)` (times the
//! scale under `antialias` when shrinking) for output coordinate `i` mapped to input
//! coordinate `x_i`, over indexes extended past both edges; the extension is folded onto the
//! edge rows (ONNX pads with the edge value) or, under `exclude_outside`, dropped and the rest
//! renormalized. Nearest picks the one index ONNX's rounding picks. A non-finite input
//! element reaches every output of its row along the axis (its zero coefficients multiply
//! it), where ONNX's gather reads only its neighbours.

use super::{literal, operand, Out, R};
use crate::onnx::tensor::{Const, Data};
use crate::onnx::write::Writer;
use crate::onnx::{Dyn, Env, Node, Value};

/// How nearest mode rounds an input coordinate to an index.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Round {
    PreferFloor,
    PreferCeil,
    Floor,
    Ceil,
}

/// The interpolation between input elements.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Nearest(Round),
    Linear,
    /// Keys' cubic convolution with coefficient `a`.
    Cubic(f32),
}

/// What the node asks for besides its scales.
struct Spec {
    mode: Mode,
    /// The coordinate transformation mode.
    coords: String,
    antialias: bool,
    exclude_outside: bool,
}

/// One axis's scale: a constant, or the `.mdl` name of a one-element tensor computed at run
/// time.
enum Scale {
    Const(f64),
    Run(Dyn),
}

/// The node's resize of input 0: every axis whose size or coordinates change gets its matrix.
pub(super) fn resize(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
    let x = operand(node, env, w, 0)?;
    let spec = spec(node)?;
    let (scales, out) = scales_and_sizes(node, env, w, &x.shape)?;
    let rank = x.shape.len();
    let mut expr = x.expr.clone();
    let mut syms = x.syms.clone();
    for axis in 0..rank {
        let (n_in, n_out) = (x.shape[axis], out[axis]);
        let same = matches!(scales[axis], Scale::Const(s) if s == 1.0)
            && n_in == n_out
            && spec.coords != "tf_half_pixel_for_nn";
        if (n_in == 1 && n_out == 1) || same {
            continue;
        }
        if rank < 2 || axis + 2 < rank {
            let what = match scales[axis] {
                Scale::Run(_) => format!(
                    "the scale of axis {axis} (size {n_in}) is computed at run time, so it may resize that axis"
                ),
                Scale::Const(_) => format!("resizes axis {axis} of a rank-{rank} input"),
            };
            return Err(node.err(
                what,
                "memc resizes the last two axes of an input of rank 2 or more; make the scales an \
                 initializer, or pass only the last two axes' scales with `axes`",
            ));
        }
        let m = matrix(node, w, &spec, &scales[axis], (n_in, n_out), axis)?;
        expr = if axis + 2 == rank {
            format!("{} @ {expr}", m.expr)
        } else {
            format!("{expr} @ transpose({})", m.expr)
        };
        syms[axis] = None;
    }
    Ok(Out::Expr(expr, out, syms))
}

/// The node's mode and options; refuses what the matrices cannot compute.
fn spec(node: &Node) -> R<Spec> {
    let refuse = |what: String| {
        node.err(
            what,
            "memc imports nearest, linear and cubic Resize of the last two axes, any coordinate \
             transformation but tf_crop_and_resize",
        )
    };
    let upsample = node.op() == "Upsample";
    if !upsample && node.opset < 11 {
        return Err(refuse(format!(
            "Resize of opset {} is imported as nearest by one integer factor only",
            node.opset
        )));
    }
    let mode = node.string("mode").unwrap_or_else(|| "nearest".into());
    let round = node
        .string("nearest_mode")
        .unwrap_or_else(|| "round_prefer_floor".into());
    let mode = match (mode.as_str(), round.as_str()) {
        // Upsample repeats elements: the floor of the asymmetric coordinate.
        ("nearest", _) if upsample => Mode::Nearest(Round::Floor),
        ("nearest", "round_prefer_floor") => Mode::Nearest(Round::PreferFloor),
        ("nearest", "round_prefer_ceil") => Mode::Nearest(Round::PreferCeil),
        ("nearest", "floor") => Mode::Nearest(Round::Floor),
        ("nearest", "ceil") => Mode::Nearest(Round::Ceil),
        ("nearest", other) => return Err(refuse(format!("nearest_mode `{other}` is not ONNX's"))),
        ("linear" | "bilinear", _) => Mode::Linear,
        ("cubic", _) if !upsample => Mode::Cubic(node.float("cubic_coeff_a", -0.75)),
        (other, _) => return Err(refuse(format!("mode `{other}` is not supported"))),
    };
    let coords = if upsample {
        "asymmetric".to_string()
    } else {
        node.string("coordinate_transformation_mode")
            .unwrap_or_else(|| "half_pixel".into())
    };
    let known = [
        "half_pixel",
        "half_pixel_symmetric",
        "pytorch_half_pixel",
        "align_corners",
        "asymmetric",
        "tf_half_pixel_for_nn",
    ];
    if !known.contains(&coords.as_str()) {
        return Err(refuse(format!(
            "coordinate_transformation_mode `{coords}` is not supported"
        )));
    }
    if let Mode::Cubic(a) = mode {
        if !a.is_finite() {
            return Err(refuse(format!("cubic_coeff_a is {a}")));
        }
    }
    Ok(Spec {
        mode,
        coords,
        antialias: node.int("antialias", 0) != 0 && !matches!(mode, Mode::Nearest(_)),
        exclude_outside: node.int("exclude_outside", 0) != 0,
    })
}

/// The scale and output size of every axis, from the scales (an attribute before Upsample-9,
/// an input after) or the sizes, over `axes` when given. Scales or sizes computed at run
/// time take the output sizes from the output's declared shape.
fn scales_and_sizes(
    node: &Node,
    env: &Env,
    w: &mut Writer,
    shape: &[usize],
) -> R<(Vec<Scale>, Vec<usize>)> {
    let rank = shape.len();
    let axes: Vec<usize> = match node.ints("axes") {
        None => (0..rank).collect(),
        Some(a) => a
            .iter()
            .map(|&v| {
                let v = if v < 0 { v + rank as i64 } else { v };
                usize::try_from(v)
                    .ok()
                    .filter(|&v| v < rank)
                    .ok_or_else(|| {
                        node.err(
                            format!("axes {a:?} do not fit rank {rank}"),
                            "the file is malformed",
                        )
                    })
            })
            .collect::<R<_>>()?,
    };
    let present = |i: usize| -> R<Option<&Value>> {
        match node.input_name(i) {
            None => Ok(None),
            Some(_) => match node.input(env, i)? {
                Value::Const(c) if c.data.len() == 0 => Ok(None),
                v => Ok(Some(v)),
            },
        }
    };
    let (scales_at, sizes_at) = match node.op() {
        "Upsample" => (1, None),
        _ => (2, Some(3)),
    };
    let source = if node.op() == "Upsample" && node.opset < 9 {
        let v: Vec<f32> = node
            .attr("scales")
            .map(|a| a.floats.clone())
            .unwrap_or_default();
        Some(Value::Const(std::rc::Rc::new(Const::new(
            vec![v.len()],
            Data::Float(v),
        ))))
    } else {
        present(scales_at)?.cloned()
    };
    let mut scales: Vec<Scale> = (0..rank).map(|_| Scale::Const(1.0)).collect();
    let mut out = shape.to_vec();
    let count_is = |n: usize, what: &str| -> R<()> {
        if n != axes.len() {
            return Err(node.err(
                format!("{what} has {n} values for {} axes", axes.len()),
                "the file is malformed",
            ));
        }
        Ok(())
    };
    match (source, sizes_at.map(present).transpose()?.flatten()) {
        (Some(Value::Const(c)), _) => {
            let v = c.floats();
            count_is(v.len(), "scales")?;
            for (k, &a) in axes.iter().enumerate() {
                let s = f64::from(v[k]);
                let n = (s * shape[a] as f64).floor();
                if !(s > 0.0 && n >= 1.0 && n <= u32::MAX as f64) {
                    return Err(node.err(
                        format!("scale {s} of axis {a} leaves no output"),
                        "give positive scales",
                    ));
                }
                scales[a] = Scale::Const(s);
                out[a] = n as usize;
            }
        }
        (Some(Value::Dyn(d)), _) => {
            count_is(d.shape.iter().product(), "scales")?;
            let declared = declared(node, w, rank, &d.expr)?;
            let name = node.p.output.first().cloned().unwrap_or_default();
            for (k, &a) in axes.iter().enumerate() {
                let expr = format!("slice({}, {k}, {}, axis = 0)", d.expr, k + 1);
                let s = w.bind(&format!("{name}_scale{a}"), expr, vec![1], vec![None]);
                scales[a] = Scale::Run(s);
                out[a] = declared[a];
            }
            if let Some(a) = (0..rank).find(|a| !axes.contains(a) && declared[*a] != shape[*a]) {
                return Err(node.err(
                    format!(
                        "output `{name}` is declared {declared:?}, resizing axis {a} not in `axes`"
                    ),
                    "the file is malformed",
                ));
            }
        }
        (None, Some(v)) => {
            let policy = node
                .string("keep_aspect_ratio_policy")
                .unwrap_or_else(|| "stretch".into());
            if policy != "stretch" {
                return Err(node.err(
                    format!("keep_aspect_ratio_policy `{policy}` is not supported"),
                    "export with `stretch`, or with scales",
                ));
            }
            // Sizes computed at run time are the sizes the output's declared shape states.
            let sizes: Vec<i64> = match v {
                Value::Const(c) => c.ints(),
                Value::Dyn(d) => {
                    let declared = declared(node, w, rank, &d.expr)?;
                    axes.iter().map(|&a| declared[a] as i64).collect()
                }
            };
            count_is(sizes.len(), "sizes")?;
            for (k, &a) in axes.iter().enumerate() {
                let n = usize::try_from(sizes[k]).ok().filter(|&n| n > 0);
                let Some(n) = n else {
                    return Err(node.err(
                        format!("size {} of axis {a} is not positive", sizes[k]),
                        "give positive sizes",
                    ));
                };
                scales[a] = Scale::Const(n as f64 / shape[a] as f64);
                out[a] = n;
            }
        }
        (None, None) => {
            return Err(node.err("gives neither scales nor sizes", "the file is malformed"))
        }
    }
    Ok((scales, out))
}

/// The static shape the graph declares for the node's output, which scales or sizes
/// computed at run time (`operand`) must give.
fn declared(node: &Node, w: &Writer, rank: usize, operand: &str) -> R<Vec<usize>> {
    let name = node.p.output.first().cloned().unwrap_or_default();
    let Some(declared) = w.declared_shape(&name).map(<[usize]>::to_vec) else {
        return Err(node.err(
            format!(
                "`{operand}` is computed at run time and output `{name}` declares no static shape"
            ),
            "declare the output's shape in the graph, or make the scales or sizes an initializer",
        ));
    };
    if declared.len() != rank {
        return Err(node.err(
            format!("output `{name}` is declared {declared:?} for a rank-{rank} input"),
            "the file is malformed",
        ));
    }
    Ok(declared)
}

/// A frozen constant of the node named `<output>_<what>`.
fn constant(node: &Node, w: &mut Writer, what: &str, shape: Vec<usize>, v: Vec<f32>) -> Dyn {
    let out = node.p.output.first().cloned().unwrap_or_default();
    w.constant(&format!("{out}_{what}"), &Const::new(shape, Data::Float(v)))
}

/// `let <output>_<what> = expr`, a value of `shape`.
fn bind(node: &Node, w: &mut Writer, what: &str, expr: String, shape: Vec<usize>) -> Dyn {
    let out = node.p.output.first().cloned().unwrap_or_default();
    let syms = vec![None; shape.len()];
    w.bind(&format!("{out}_{what}"), expr, shape, syms)
}

/// Indexes `from, from + 1, ...` as `n` floats.
fn indexes(from: i64, n: usize) -> Vec<f32> {
    (0..n).map(|i| (from + i as i64) as f32).collect()
}

/// The interpolation matrix `[out, in]` of one axis.
fn matrix(
    node: &Node,
    w: &mut Writer,
    spec: &Spec,
    scale: &Scale,
    (n_in, n_out): (usize, usize),
    axis: usize,
) -> R<Dyn> {
    let s = match scale {
        Scale::Const(s) => constant(node, w, &format!("scale{axis}"), vec![1], vec![*s as f32]),
        Scale::Run(d) => d.clone(),
    };
    let rows = constant(
        node,
        w,
        &format!("rows{axis}"),
        vec![n_out, 1],
        indexes(0, n_out),
    );
    let x = bind(
        node,
        w,
        &format!("coord{axis}"),
        coordinate(spec, &rows.expr, &s.expr, (n_in, n_out)),
        vec![n_out, 1],
    );
    if let Mode::Nearest(round) = spec.mode {
        let cols = constant(
            node,
            w,
            &format!("cols{axis}"),
            vec![1, n_in],
            indexes(0, n_in),
        );
        let d = bind(
            node,
            w,
            &format!("offset{axis}"),
            format!("clamp({}, 0, {}) - {}", x.expr, n_in - 1, cols.expr),
            vec![n_out, n_in],
        );
        // The index j is picked where d = x - j lies in the rounding's half-open unit range.
        let (lo, hi, lo_fn, hi_fn) = match round {
            Round::PreferFloor => (-0.5, 0.5, "greater", "less_equal"),
            Round::PreferCeil => (-0.5, 0.5, "greater_equal", "less"),
            Round::Floor => (0.0, 1.0, "greater_equal", "less"),
            Round::Ceil => (-1.0, 0.0, "greater", "less_equal"),
        };
        let e = &d.expr;
        let expr = format!(
            "{lo_fn}({e}, {}) * {hi_fn}({e}, {})",
            literal(lo),
            literal(hi)
        );
        return Ok(bind(
            node,
            w,
            &format!("weights{axis}"),
            expr,
            vec![n_out, n_in],
        ));
    }
    let support: usize = if matches!(spec.mode, Mode::Linear) {
        1
    } else {
        2
    };
    // Indexes past each edge with a nonzero kernel: the kernel spans `support / scale`
    // under antialias (the scale is above n_out / n_in), and coordinates reach half a step
    // past the edges.
    let stretch = if spec.antialias {
        n_in.div_ceil(n_out)
    } else {
        1
    };
    let m = (support + 1) * stretch + 1;
    let wide = n_in + 2 * m;
    let cols = constant(
        node,
        w,
        &format!("cols{axis}"),
        vec![1, wide],
        indexes(-(m as i64), wide),
    );
    let mut t = format!("{} - {}", cols.expr, x.expr);
    if spec.antialias {
        t = format!("({t}) * minimum({}, 1)", s.expr);
    }
    let t = bind(node, w, &format!("offset{axis}"), t, vec![n_out, wide]);
    let a = bind(
        node,
        w,
        &format!("distance{axis}"),
        format!("maximum({0}, neg({0}))", t.expr),
        vec![n_out, wide],
    );
    let kernel = match spec.mode {
        Mode::Cubic(k) => {
            let a = &a.expr;
            let (near, far) = (format!("less_equal({a}, 1)"), format!("less({a}, 2)"));
            format!(
                "{near} * (({a} * {} - {}) * {a} * {a} + 1) + ({far} - {near}) * ((({a} * {} - {}) * {a} + {}) * {a} - {})",
                literal(k + 2.0),
                literal(k + 3.0),
                literal(k),
                literal(5.0 * k),
                literal(8.0 * k),
                literal(4.0 * k),
            )
        }
        _ => format!("relu(1 - {})", a.expr),
    };
    let mut raw = bind(node, w, &format!("kernel{axis}"), kernel, vec![n_out, wide]);
    if spec.antialias {
        let expr = format!("{0} / sum({0}, axis = 1, keepdim = true)", raw.expr);
        raw = bind(
            node,
            w,
            &format!("normalized{axis}"),
            expr,
            vec![n_out, wide],
        );
    }
    let expr = if spec.exclude_outside {
        let inner = bind(
            node,
            w,
            &format!("inside{axis}"),
            format!("slice({}, {m}, {}, axis = 1)", raw.expr, m + n_in),
            vec![n_out, n_in],
        );
        format!("{0} / sum({0}, axis = 1, keepdim = true)", inner.expr)
    } else {
        // Each extended index adds its coefficient to the edge row it reads.
        let mut fold = vec![0.0; wide * n_in];
        for p in 0..wide {
            let j = p.saturating_sub(m).min(n_in - 1);
            fold[p * n_in + j] = 1.0;
        }
        let e = constant(node, w, &format!("edges{axis}"), vec![wide, n_in], fold);
        format!("{} @ {}", raw.expr, e.expr)
    };
    Ok(bind(
        node,
        w,
        &format!("weights{axis}"),
        expr,
        vec![n_out, n_in],
    ))
}

/// The input coordinate of each output row `rows` (`[out, 1]`) under the node's coordinate
/// transformation, for scale `s` (a one-element tensor), as ONNX states it (the output
/// width in its formulas is `s * n_in`, not the rounded size).
fn coordinate(spec: &Spec, rows: &str, s: &str, (n_in, n_out): (usize, usize)) -> String {
    let half = |shift: f32, offset: f32| {
        format!("({rows} + {}) / {s} + {}", literal(shift), literal(offset))
    };
    match spec.coords.as_str() {
        "asymmetric" => format!("{rows} / {s}"),
        "tf_half_pixel_for_nn" => format!("({rows} + 0.5) / {s}"),
        "pytorch_half_pixel" => format!(
            "where(equal({s} * {n_in}, 1), {}, {})",
            literal(-0.5),
            half(0.5, -0.5)
        ),
        "align_corners" => format!(
            "where(equal({s} * {n_in}, 1), 0, {rows} * {} / ({s} * {n_in} - 1))",
            n_in - 1
        ),
        // Centres the rounded output on the input: an offset of n_in / 2 * (1 - n_out /
        // (s * n_in)).
        "half_pixel_symmetric" => half(0.5 - n_out as f32 / 2.0, (n_in as f32 - 1.0) / 2.0),
        _ => half(0.5, -0.5),
    }
}
