//! ONNX elementwise ops as `.mdl` expressions: unary functions (every [`UnaryFn`] with an
//! ONNX name), `Gelu`, arithmetic, `Sum`, `Pow` (small whole powers as products), and the ops that
//! pass their input on (`Identity`, eval-mode `Dropout`, `Cast` to float).

use super::{broadcast_dyns, operand, operands, same, Out, R};
use crate::ir::UnaryFn;
use crate::onnx::tensor::{Const, Data};
use crate::onnx::write::{number, shape_text, Writer};
use crate::onnx::{Env, Node, Value};

/// Maps `node` when it is an elementwise op; `None` for other ops.
pub(super) fn map(node: &Node, env: &Env, w: &mut Writer) -> R<Option<Out>> {
    let op = node.op();
    if let Some(f) = UnaryFn::ALL.iter().find(|f| f.onnx_name() == Some(op)) {
        let x = operand(node, env, w, 0)?;
        return same(&x, format!("{}({})", f.name(), x.expr)).map(Some);
    }
    let out = match op {
        "Gelu" => gelu(node, env, w),
        "Identity" | "Dropout" | "Cast" => pass_on(node, env, w),
        "CastLike" => cast_like(node, env, w),
        "Add" | "Sub" | "Mul" | "Div" => arithmetic(node, env, w, op),
        "Sum" => sum(node, env, w),
        "Pow" => power(node, env, w),
        _ => return Ok(None),
    };
    out.map(Some)
}

/// `Gelu`: the erf form unless `approximate = tanh`.
fn gelu(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
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

/// `Identity`, eval-mode `Dropout` and `Cast` to float: the input itself. A boolean mask
/// (a comparison's result) casts to float as a value of its own, and to bool as itself.
/// Dropout's optional mask output is all true.
fn pass_on(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
    let op = node.op();
    let to = node.int("to", 0);
    if op == "Cast" {
        let x = operand(node, env, w, 0)?;
        let mask = w.is_mask(&x);
        if mask && matches!(to, 1 | 11) {
            return same(&x, x.expr.clone());
        }
        if mask && to == 9 {
            return Ok(Out::Values(vec![Value::Dyn(x)]));
        }
        if !matches!(to, 1 | 11) {
            return Err(node.err(
                format!(
                    "casts a computed value to {}",
                    crate::onnx::tensor::dtype_name(to as i32)
                ),
                "memc computes in float32; only casts to float (and of comparison results to bool) are imported",
            ));
        }
    }
    let x = operand(node, env, w, 0)?;
    if op == "Cast" && w.is_integer(&x) {
        return Err(node.err(
            "casts an integer input to float",
            "memc has no integer-to-float conversion; integer inputs can only be ids of an embedding",
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
    match node.p.output.get(1).filter(|n| !n.is_empty()) {
        Some(name) if op == "Dropout" => {
            // At inference every element is kept: the mask is all true.
            let ones = Const::new(vec![1; x.shape.len()], Data::Float(vec![1.0]));
            let one = w.param(&format!("{name}.ones"), &ones);
            let expr = format!("expand({}, ({}))", one.expr, shape_text(&x.shape, &x.syms));
            let mask = w.bind(name, expr, x.shape.clone(), x.syms.clone());
            w.mark_mask(&mask);
            Ok(Out::Values(vec![Value::Dyn(x), Value::Dyn(mask)]))
        }
        _ => Ok(Out::Values(vec![Value::Dyn(x)])),
    }
}

/// `CastLike(x, like)` between float tensors: `x` itself (memc computes in float32).
fn cast_like(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
    let float = |i: usize, w: &Writer| -> R<bool> {
        Ok(match node.input(env, i)? {
            Value::Const(c) => matches!(c.data, crate::onnx::tensor::Data::Float(_)),
            Value::Dyn(d) => !w.is_integer(d) && !w.is_mask(d),
        })
    };
    if !float(0, w)? || !float(1, w)? {
        return Err(node.err(
            "casts to or from a type that is not float",
            "memc imports CastLike between float tensors",
        ));
    }
    Ok(Out::Values(vec![node.input(env, 0)?.clone()]))
}

/// Binary arithmetic; a one-element constant that does not widen the result is written as
/// a number (exact for + - *), others as parameters.
fn arithmetic(node: &Node, env: &Env, w: &mut Writer, op: &str) -> R<Out> {
    let sym = match op {
        "Add" => "+",
        "Sub" => "-",
        "Mul" => "*",
        _ => "/",
    };
    let (texts, out, syms) = two_operands(node, env, w, op != "Div")?;
    Ok(Out::Expr(
        format!("{} {sym} {}", texts[0], texts[1]),
        out,
        syms,
    ))
}

/// Two operands' `.mdl` texts, with their broadcast shape and dim names.
type Operands = (Vec<String>, Vec<usize>, Vec<Option<String>>);

/// A binary node's two operands as `.mdl` text (a finite one-element constant of no higher
/// rank than the other operand as a number literal, where `literals` allows), with the
/// broadcast shape and dim names.
fn two_operands(node: &Node, env: &Env, w: &mut Writer, literals: bool) -> R<Operands> {
    let literal = |i: usize| -> Option<String> {
        match node.input(env, i).ok()? {
            Value::Const(c) if c.data.len() == 1 && literals => {
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
    Ok((texts, out, syms))
}

/// `Sum` of any number of operands.
fn sum(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
    let mut ds = operands(node, env, w)?;
    if ds.len() <= 1 {
        return ds
            .pop()
            .map(|d| Out::Values(vec![Value::Dyn(d)]))
            .ok_or_else(|| node.err("has no inputs", "the file is malformed"));
    }
    let (out, syms) = broadcast_dyns(node, &ds)?;
    let terms: Vec<&str> = ds.iter().map(|d| d.expr.as_str()).collect();
    Ok(Out::Expr(terms.join(" + "), out, syms))
}

/// `Pow(x, n)` for a constant whole `n` from -4 to 4, not 0: `x * x * ...` (n factors), its
/// reciprocal for `n < 0`; any other exponent (a constant, or computed at run time) ->
/// `pow(x, y)`.
fn power(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
    let whole = match node.input(env, 1)? {
        Value::Const(e) if e.data.len() == 1 => {
            let n = e.data.get(0);
            ((1.0..=4.0).contains(&n.abs()) && n.fract() == 0.0).then_some(n)
        }
        _ => None,
    };
    let Some(n) = whole else {
        for i in 0..2 {
            if let Value::Dyn(d) = node.input(env, i)? {
                if w.is_integer(d) {
                    return Err(node.err(
                        format!("input {i} (`{}`) is an integer tensor", d.expr),
                        "memc raises floats to float powers; cast integer inputs to float in the model",
                    ));
                }
            }
        }
        let (texts, out, syms) = two_operands(node, env, w, true)?;
        return Ok(Out::Expr(
            format!("pow({}, {})", texts[0], texts[1]),
            out,
            syms,
        ));
    };
    let x = operand(node, env, w, 0)?;
    let product = vec![x.expr.as_str(); n.abs() as usize].join(" * ");
    if n < 0.0 {
        return same(&x, format!("reciprocal({product})"));
    }
    if n == 1.0 {
        return Ok(Out::Values(vec![Value::Dyn(x)]));
    }
    same(&x, product)
}
