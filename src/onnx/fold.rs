//! Constant folding: a node whose inputs are all constants (and `Shape` and `Size` of any
//! value, whose shape is known) is evaluated at import, so shape arithmetic and generated weights
//! (`ConstantOfShape`) become constants and then parameters.

use super::shapes::{
    axes_arg, axis, broadcast_index, broadcast_inputs, coords, flat, flattened, reshape_target,
    slice_ranges, squeezed, transpose_perm, unsqueezed,
};
use super::tensor::{self, Const, Data};
use super::{Env, Node, Value};
use crate::diagnostic::UserError;
use std::rc::Rc;

type R<T> = Result<T, UserError>;

fn shape_const(shape: &[usize], dims: &[Option<String>], node: &Node) -> Const {
    let rank = shape.len() as i64;
    let clamp = |v: i64| (if v < 0 { v + rank } else { v }).clamp(0, rank) as usize;
    let start = clamp(node.int("start", 0));
    let end = clamp(node.int("end", rank)).max(start);
    Const {
        shape: vec![end - start],
        data: Data::Int(shape[start..end].iter().map(|&d| d as i64).collect()),
        dims: dims.get(start..end).map(<[_]>::to_vec).unwrap_or_default(),
    }
}

fn reject_dims(node: &Node, ins: &[Rc<Const>]) -> R<()> {
    if let Some(d) = ins.iter().flat_map(|c| c.dims.iter().flatten()).next() {
        return Err(node.err(
            format!("computes with the model dim `{d}`, which memc cannot keep symbolic here"),
            "export with a fixed size for this dim, or use shapes that only copy dims",
        ));
    }
    Ok(())
}

/// Elementwise `f` over broadcast inputs; the result is float when `float`.
fn elementwise(node: &Node, ins: &[Rc<Const>], float: bool, f: impl Fn(&[f64]) -> f64) -> R<Const> {
    reject_dims(node, ins)?;
    let shapes: Vec<&[usize]> = ins.iter().map(|c| &c.shape[..]).collect();
    let out = broadcast_inputs(node, &shapes)?;
    let idx: Vec<Vec<usize>> = ins
        .iter()
        .map(|c| broadcast_index(&out, &c.shape))
        .collect();
    let numel: usize = out.iter().product();
    let mut args = vec![0.0; ins.len()];
    let values = (0..numel).map(|i| {
        for (k, c) in ins.iter().enumerate() {
            args[k] = c.data.get(idx[k][i]);
        }
        f(&args)
    });
    let data = if float {
        Data::Float(values.map(|v| v as f32).collect())
    } else {
        Data::Int(values.map(|v| v as i64).collect())
    };
    Ok(Const::new(out, data))
}

fn is_float(c: &Const) -> bool {
    matches!(c.data, Data::Float(_))
}

fn gather(node: &Node, data: &Const, indices: &Const) -> R<Const> {
    let ax = axis(node, node.int("axis", 0), data.shape.len())?;
    let n = data.shape[ax] as i64;
    let mut idx = Vec::new();
    for i in indices.ints() {
        let j = if i < 0 { i + n } else { i };
        if !(0..n).contains(&j) {
            return Err(node.err(
                format!("index {i} is out of range for a dim of {n}"),
                "the file is malformed",
            ));
        }
        idx.push(j as usize);
    }
    let outer: usize = data.shape[..ax].iter().product();
    let inner: usize = data.shape[ax + 1..].iter().product();
    let mut src = Vec::new();
    for o in 0..outer {
        for &j in &idx {
            for i in 0..inner {
                src.push((o * data.shape[ax] + j) * inner + i);
            }
        }
    }
    let mut shape = data.shape[..ax].to_vec();
    shape.extend(&indices.shape);
    shape.extend(&data.shape[ax + 1..]);
    Ok(data.take(&src, shape))
}

fn concat(node: &Node, ins: &[Rc<Const>]) -> R<Const> {
    let first = &ins[0];
    let ax = axis(node, node.int("axis", 0), first.shape.len())?;
    let outer: usize = first.shape[..ax].iter().product();
    let mut shape = first.shape.clone();
    shape[ax] = ins
        .iter()
        .map(|c| c.shape.get(ax).copied().unwrap_or(0))
        .sum();
    let float = ins.iter().any(|c| is_float(c));
    let mut vals = Vec::new();
    let mut dims = Vec::new();
    for o in 0..outer {
        for c in ins {
            if c.shape.len() != first.shape.len() {
                return Err(node.err("inputs differ in rank", "the file is malformed"));
            }
            let chunk: usize = c.shape[ax..].iter().product();
            for i in o * chunk..(o + 1) * chunk {
                vals.push(c.data.get(i));
                dims.push(c.dims.get(i).cloned().flatten());
            }
        }
    }
    let data = if float {
        Data::Float(vals.iter().map(|&v| v as f32).collect())
    } else {
        Data::Int(vals.iter().map(|&v| v as i64).collect())
    };
    let mut c = Const::new(shape, data);
    if dims.iter().any(Option::is_some) {
        c.dims = dims;
    }
    Ok(c)
}

fn transpose(node: &Node, c: &Const) -> R<Const> {
    let rank = c.shape.len();
    let perm = transpose_perm(node, rank)?;
    let out: Vec<usize> = perm.iter().map(|&p| c.shape[p]).collect();
    let numel: usize = out.iter().product();
    let src: Vec<usize> = (0..numel)
        .map(|i| {
            let oc = coords(i, &out);
            let mut ic = vec![0; rank];
            for (k, &p) in perm.iter().enumerate() {
                ic[p] = oc[k];
            }
            flat(&ic, &c.shape)
        })
        .collect();
    Ok(c.take(&src, out))
}

fn slice(node: &Node, env: &Env, c: &Const) -> R<Const> {
    let ranges = slice_ranges(node, env, &c.shape)?;
    let picks: Vec<Vec<usize>> = ranges
        .iter()
        .map(|&(s, e, st)| {
            let mut v = Vec::new();
            let mut i = s;
            while (st > 0 && i < e) || (st < 0 && i > e) {
                v.push(i as usize);
                i += st;
            }
            v
        })
        .collect();
    let out: Vec<usize> = picks.iter().map(Vec::len).collect();
    let numel: usize = out.iter().product();
    let src: Vec<usize> = (0..numel)
        .map(|i| {
            let oc = coords(i, &out);
            let ic: Vec<usize> = oc.iter().enumerate().map(|(k, &o)| picks[k][o]).collect();
            flat(&ic, &c.shape)
        })
        .collect();
    Ok(c.take(&src, out))
}

fn constant(node: &Node) -> R<Const> {
    if let Some(t) = node.attr("value").and_then(|a| a.t.as_ref()) {
        return tensor::decode(t)
            .map_err(|e| node.err(format!("its value: {e}"), "the file is malformed"));
    }
    if let Some(a) = node.attr("value_float") {
        return Ok(Const::new(vec![], Data::Float(vec![a.f])));
    }
    if let Some(a) = node.attr("value_floats") {
        return Ok(Const::new(
            vec![a.floats.len()],
            Data::Float(a.floats.clone()),
        ));
    }
    if let Some(a) = node.attr("value_int") {
        return Ok(Const::new(vec![], Data::Int(vec![a.i])));
    }
    if let Some(a) = node.attr("value_ints") {
        return Ok(Const::new(vec![a.ints.len()], Data::Int(a.ints.clone())));
    }
    Err(node.err(
        "has no value memc reads (value, value_float(s), value_int(s))",
        "sparse and string constants are not supported",
    ))
}

fn constant_of_shape(node: &Node, shape: &Const) -> R<Const> {
    reject_dims(node, &[Rc::new(shape.clone())])?;
    let mut dims = Vec::new();
    for d in shape.ints() {
        dims.push(
            usize::try_from(d)
                .map_err(|_| node.err(format!("negative dim {d}"), "the file is malformed"))?,
        );
    }
    let numel = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| n < 1 << 28)
        .ok_or_else(|| node.err(format!("shape {dims:?} is too large"), "check the model"))?;
    let value = match node.attr("value").and_then(|a| a.t.as_ref()) {
        Some(t) => tensor::decode(t)
            .map_err(|e| node.err(format!("its value: {e}"), "the file is malformed"))?,
        None => Const::new(vec![1], Data::Float(vec![0.0])),
    };
    if value.data.len() != 1 {
        return Err(node.err("its value must hold one element", "the file is malformed"));
    }
    let data = match value.data {
        Data::Float(v) => Data::Float(vec![v[0]; numel]),
        Data::Int(v) => Data::Int(vec![v[0]; numel]),
    };
    Ok(Const::new(dims, data))
}

fn cast(node: &Node, c: &Const) -> R<Const> {
    let to = node.int("to", 0) as i32;
    let values = (0..c.data.len()).map(|i| c.data.get(i));
    let data = match to {
        1 | 11 => Data::Float(values.map(|v| v as f32).collect()),
        9 => Data::Int(values.map(|v| i64::from(v != 0.0)).collect()),
        t if tensor::is_integer(t) => Data::Int(values.map(|v| v as i64).collect()),
        t => {
            return Err(node.err(
                format!(
                    "casts to {}, which memc does not support",
                    tensor::dtype_name(t)
                ),
                "memc computes in float32 (mixed precision is chosen in `train`)",
            ))
        }
    };
    Ok(Const {
        shape: c.shape.clone(),
        data,
        dims: c.dims.clone(),
    })
}

fn unary(op: &str) -> Option<fn(f64) -> f64> {
    Some(match op {
        "Neg" => |x: f64| -x,
        "Sqrt" => f64::sqrt,
        "Exp" => f64::exp,
        "Log" => f64::ln,
        "Abs" => f64::abs,
        "Floor" => f64::floor,
        "Ceil" => f64::ceil,
        "Reciprocal" => |x: f64| 1.0 / x,
        "Relu" => |x: f64| x.max(0.0),
        "Not" => |x: f64| f64::from(x == 0.0),
        _ => return None,
    })
}

/// A binary function and whether it yields booleans.
type BinaryFn = (fn(f64, f64) -> f64, bool);

fn binary(op: &str) -> Option<BinaryFn> {
    Some(match op {
        "Add" => (|a, b| a + b, false),
        "Sub" => (|a, b| a - b, false),
        "Mul" => (|a, b| a * b, false),
        "Div" => (|a, b| a / b, false),
        "Pow" => (f64::powf, false),
        "Min" => (f64::min, false),
        "Max" => (f64::max, false),
        "Equal" => (|a, b| f64::from(a == b), true),
        "Less" => (|a, b| f64::from(a < b), true),
        "Greater" => (|a, b| f64::from(a > b), true),
        "And" => (|a, b| f64::from(a != 0.0 && b != 0.0), true),
        "Or" => (|a, b| f64::from(a != 0.0 || b != 0.0), true),
        _ => return None,
    })
}

/// Evaluates `node` when all its inputs are constant (or it is `Shape`); `None` when the
/// node must run in the model instead.
pub(super) fn fold(node: &Node, env: &Env) -> R<Option<Const>> {
    let op = node.op();
    if op == "Shape" {
        return Ok(Some(match node.input(env, 0)? {
            Value::Dyn(d) => shape_const(&d.shape, &d.syms, node),
            Value::Const(c) => shape_const(&c.shape, &[], node),
        }));
    }
    if op == "Size" {
        let (shape, syms) = match node.input(env, 0)? {
            Value::Dyn(d) => (d.shape.clone(), d.syms.clone()),
            Value::Const(c) => (c.shape.clone(), Vec::new()),
        };
        if let Some(d) = syms.iter().flatten().next() {
            return Err(node.err(
                format!("counts elements over the model dim `{d}`, which memc cannot keep symbolic here"),
                "export with a fixed size for this dim",
            ));
        }
        let n = shape.iter().product::<usize>() as i64;
        return Ok(Some(Const::new(vec![], Data::Int(vec![n]))));
    }
    let mut ins = Vec::new();
    for i in 0..node.p.input.len() {
        if node.input_name(i).is_none() {
            continue;
        }
        match node.input(env, i)? {
            Value::Const(c) => ins.push(c.clone()),
            Value::Dyn(_) => return Ok(None),
        }
    }
    let first = || {
        ins.first()
            .cloned()
            .ok_or_else(|| node.err("input 0 is missing", "the file is malformed"))
    };
    if let Some(f) = unary(op) {
        let float = is_float(first()?.as_ref());
        return elementwise(node, &ins[..1], float, |a| f(a[0])).map(Some);
    }
    if let Some((f, boolean)) = binary(op) {
        if ins.len() != 2 {
            return Ok(None);
        }
        let float = !boolean && ins.iter().any(|c| is_float(c));
        return elementwise(node, &ins, float, |a| f(a[0], a[1])).map(Some);
    }
    let c = match op {
        "Constant" => constant(node)?,
        "ConstantOfShape" => constant_of_shape(node, first()?.as_ref())?,
        "Identity" | "Dropout" => first()?.as_ref().clone(),
        "Cast" => cast(node, first()?.as_ref())?,
        "Where" if ins.len() == 3 => {
            let float = is_float(&ins[1]) || is_float(&ins[2]);
            elementwise(node, &ins, float, |a| if a[0] != 0.0 { a[1] } else { a[2] })?
        }
        "Gather" if ins.len() == 2 => gather(node, &ins[0], &ins[1])?,
        "Concat" if !ins.is_empty() => concat(node, &ins)?,
        "Transpose" => transpose(node, first()?.as_ref())?,
        "Slice" => slice(node, env, first()?.as_ref())?,
        "Unsqueeze" | "Squeeze" | "Reshape" | "Flatten" => {
            let c = first()?;
            let shape = match op {
                "Unsqueeze" => {
                    let axes = axes_arg(node, env)?.unwrap_or_default();
                    unsqueezed(node, &c.shape, &axes)?
                }
                "Squeeze" => squeezed(node, &c.shape, axes_arg(node, env)?.as_deref())?,
                "Reshape" => reshape_target(node, &c.shape, &node.konst(env, 1)?.ints())?,
                _ => flattened(node, &c.shape)?.0,
            };
            Const {
                shape,
                data: c.data.clone(),
                dims: c.dims.clone(),
            }
        }
        "Range" if ins.len() == 3 => {
            reject_dims(node, &ins)?;
            let (s, l, d) = (ins[0].data.get(0), ins[1].data.get(0), ins[2].data.get(0));
            let n = ((l - s) / d).ceil().max(0.0) as usize;
            let vals = (0..n).map(|i| s + i as f64 * d);
            let data = if is_float(&ins[0]) {
                Data::Float(vals.map(|v| v as f32).collect())
            } else {
                Data::Int(vals.map(|v| v as i64).collect())
            };
            Const::new(vec![n], data)
        }
        _ => return Ok(None),
    };
    Ok(Some(c))
}
