//! ONNX reductions and data-movement ops as `.mdl` expressions: `ReduceMean`/`Sum`/`Max`
//! (and `ReduceMin`, `ReduceSumSquare`, `ReduceL1`, `ReduceL2`, `ReduceLogSum`,
//! `ReduceLogSumExp` composed from them with `neg`, `relu`, `sqrt`, `log` and `exp`),
//! `Concat`, `Reshape`, `Flatten`, `Squeeze`, `Unsqueeze`, `Transpose`, `Split`, `Slice`
//! (constant ranges, step 1), and
//! `DepthToSpace`/`SpaceToDepth` as reshape, permute, reshape.

use super::{operand, operands, reshape_expr, tuple_text, Out, R};
use crate::onnx::shapes::{
    axes_arg, axis, flattened, reshape_target, slice_ranges, squeezed, transpose_perm, unsqueezed,
};
use crate::onnx::write::Writer;
use crate::onnx::{Env, Node, Value};

/// Maps `node` when it is a reduction or moves data; `None` for other ops.
pub(super) fn map(node: &Node, env: &Env, w: &mut Writer) -> R<Option<Out>> {
    let out = match node.op() {
        "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" | "ReduceSumSquare" | "ReduceL1"
        | "ReduceL2" | "ReduceLogSum" | "ReduceLogSumExp" => reduce(node, env, w),
        "Concat" => concat(node, env, w),
        "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" => reshape(node, env, w),
        "Transpose" => transpose(node, env, w),
        "DepthToSpace" | "SpaceToDepth" => depth_space(node, env, w),
        "Split" => split(node, env, w).map(Out::Values),
        "Slice" => slice(node, env, w),
        _ => return Ok(None),
    };
    out.map(Some)
}

/// A reduction over axes from an attribute or input 1: `ReduceMean`/`Sum`/`Max` directly,
/// the rest of the family as one of them applied to `neg`, `x * x`, `relu(x) + relu(neg(x))`
/// or `exp` of the input, and `neg`, `sqrt` or `log` of the result.
fn reduce(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
    let op = node.op();
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
    let no_axes = axes.as_ref().is_none_or(Vec::is_empty);
    let e = &x.expr;
    let (f, arg, wrap) = match op {
        "ReduceMin" => ("max", format!("neg({e})"), "neg"),
        "ReduceSumSquare" => ("sum", format!("{e} * {e}"), ""),
        "ReduceL1" => ("sum", format!("relu({e}) + relu(neg({e}))"), ""),
        "ReduceL2" => ("sum", format!("{e} * {e}"), "sqrt"),
        "ReduceLogSum" => ("sum", e.clone(), "log"),
        "ReduceLogSumExp" => ("sum", format!("exp({e})"), "log"),
        _ => (&op[6..], e.clone(), ""),
    };
    let plain = matches!(op, "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin");
    if no_axes && from_input && node.int("noop_with_empty_axes", 0) != 0 {
        if !plain {
            return Err(node.err(
                "noop_with_empty_axes without axes is not supported for this reduction",
                "give the axes to reduce",
            ));
        }
        // ONNX: with no axes and noop_with_empty_axes set, the reduction is the identity.
        return Ok(Out::Values(vec![Value::Dyn(x)]));
    }
    let axes: Vec<usize> = match axes.filter(|a| !a.is_empty()) {
        Some(a) => a.iter().map(|&v| axis(node, v, rank)).collect::<R<_>>()?,
        None => (0..rank).collect(),
    };
    let keep = node.int("keepdims", 1) != 0;
    let f = f.to_lowercase();
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
    let reduced = format!(
        "{f}({arg}, axis = {}, keepdim = {keep})",
        tuple_text(&items)
    );
    let expr = if wrap.is_empty() {
        reduced
    } else {
        format!("{wrap}({reduced})")
    };
    Ok(Out::Expr(expr, shape, syms))
}

/// `Concat` along `axis`.
fn concat(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
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
    Ok(Out::Expr(
        format!("concat({}, axis = {ax})", parts.join(", ")),
        shape,
        syms,
    ))
}

/// `Reshape`, `Flatten`, `Squeeze` and `Unsqueeze`; nothing when the shape stays.
fn reshape(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
    let op = node.op();
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
            let (shape, ax) = flattened(node, &x.shape)?;
            let lead = if ax == 1 { x.syms[0].clone() } else { None };
            (shape, vec![lead, None])
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
        return Ok(Out::Values(vec![Value::Dyn(x)]));
    }
    if shape.is_empty() {
        return Err(node.err(
            "reshapes to a scalar",
            "memc values used by later ops have rank 1 or more",
        ));
    }
    Ok(Out::Expr(reshape_expr(&x, &shape, &syms), shape, syms))
}

/// `Transpose` as `permute`; nothing for the identity permutation.
fn transpose(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
    let x = operand(node, env, w, 0)?;
    let rank = x.shape.len();
    let perm = transpose_perm(node, rank)?;
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return Ok(Out::Values(vec![Value::Dyn(x)]));
    }
    let items: Vec<String> = perm.iter().map(usize::to_string).collect();
    let shape = perm.iter().map(|&p| x.shape[p]).collect();
    let syms = perm.iter().map(|&p| x.syms[p].clone()).collect();
    Ok(Out::Expr(
        format!("permute({}, ({}))", x.expr, items.join(", ")),
        shape,
        syms,
    ))
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

/// `DepthToSpace` (DCR or CRD mode) and `SpaceToDepth` of an NCHW tensor as ONNX defines
/// them: a reshape to rank 6, a permute and a reshape back.
fn depth_space(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
    let x = operand(node, env, w, 0)?;
    let &[n, c, h, wd] = &x.shape[..] else {
        return Err(node.err(
            format!("needs an NCHW input, got shape {:?}", x.shape),
            "the file is malformed",
        ));
    };
    let b = usize::try_from(node.int("blocksize", 0)).unwrap_or(0);
    let to_space = node.op() == "DepthToSpace";
    let fits = b > 0
        && if to_space {
            c % (b * b) == 0
        } else {
            h % b == 0 && wd % b == 0
        };
    if !fits {
        return Err(node.err(
            format!("blocksize {b} does not divide the input {:?}", x.shape),
            "the file is malformed",
        ));
    }
    let (split, perm, out) = if to_space {
        let out = vec![n, c / (b * b), h * b, wd * b];
        match node.string("mode").as_deref() {
            None | Some("DCR") => ([n, b, b, c / (b * b), h, wd], [0, 3, 4, 1, 5, 2], out),
            Some("CRD") => ([n, c / (b * b), b, b, h, wd], [0, 1, 4, 2, 5, 3], out),
            Some(other) => {
                return Err(node.err(format!("mode `{other}` is unknown"), "use DCR or CRD"))
            }
        }
    } else {
        let out = vec![n, c * b * b, h / b, wd / b];
        ([n, c, h / b, b, wd / b, b], [0, 3, 5, 1, 2, 4], out)
    };
    let text = |v: &[usize]| {
        v.iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut syms = vec![None; 4];
    syms[0] = x.syms[0].clone();
    let mut first = vec![None; 6];
    first[0] = syms[0].clone();
    let expr = format!(
        "reshape(permute({}, ({})), ({}))",
        reshape_expr(&x, &split, &first),
        text(&perm),
        crate::onnx::write::shape_text(&out, &syms)
    );
    Ok(Out::Expr(expr, out, syms))
}

/// `Slice` of a computed value with constant ranges of step 1: one `slice` per cut axis; a
/// step other than 1 and an empty range are refused.
fn slice(node: &Node, env: &Env, w: &mut Writer) -> R<Out> {
    let x = operand(node, env, w, 0)?;
    let ranges = slice_ranges(node, env, &x.shape)?;
    let (mut expr, mut shape, mut syms) = (x.expr.clone(), x.shape.clone(), x.syms.clone());
    for (ax, &(start, end, step)) in ranges.iter().enumerate() {
        if (start, end, step) == (0, x.shape[ax] as i64, 1) {
            continue;
        }
        if step != 1 {
            return Err(node.err(
                format!("slices axis {ax} with step {step}"),
                "memc imports slices of computed values with step 1",
            ));
        }
        if end <= start {
            return Err(node.err(
                format!("slices axis {ax} to nothing ({start}..{end})"),
                "memc plans tensors with at least one element in every dim",
            ));
        }
        expr = format!("slice({expr}, {start}, {end}, axis = {ax})");
        shape[ax] = (end - start) as usize;
        syms[ax] = None;
    }
    if expr == x.expr {
        return Ok(Out::Values(vec![Value::Dyn(x)]));
    }
    Ok(Out::Expr(expr, shape, syms))
}
