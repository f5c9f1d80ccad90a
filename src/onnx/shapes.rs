//! ONNX shape rules shared by constant folding and mapping: broadcasting, axes, reshape
//! targets, squeeze/unsqueeze and transpose permutations, slice ranges, and row-major
//! indexing.

use super::{Env, Node};
use crate::diagnostic::UserError;

type R<T> = Result<T, UserError>;

/// Row-major coordinates of flat index `i` in `shape`.
pub(super) fn coords(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut c = vec![0; shape.len()];
    for (k, &d) in shape.iter().enumerate().rev() {
        c[k] = i % d.max(1);
        i /= d.max(1);
    }
    c
}

/// Flat index of `coords` in `shape`.
pub(super) fn flat(coords: &[usize], shape: &[usize]) -> usize {
    coords
        .iter()
        .zip(shape)
        .fold(0, |acc, (&c, &d)| acc * d + c)
}

/// Numpy broadcasting of a node's input shapes; a malformed-file diagnostic when they do not
/// broadcast.
pub(super) fn broadcast_inputs(node: &Node, shapes: &[&[usize]]) -> R<Vec<usize>> {
    broadcast(shapes).ok_or_else(|| {
        node.err(
            format!("input shapes {shapes:?} do not broadcast"),
            "the file is malformed",
        )
    })
}

/// Numpy broadcasting of several shapes, or `None` when they do not broadcast.
pub(super) fn broadcast(shapes: &[&[usize]]) -> Option<Vec<usize>> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1; rank];
    for s in shapes {
        for (k, &d) in s.iter().enumerate() {
            let o = &mut out[rank - s.len() + k];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return None;
            }
        }
    }
    Some(out)
}

/// For each element of `out`, the flat index of the element of `inp` broadcast onto it.
pub(super) fn broadcast_index(out: &[usize], inp: &[usize]) -> Vec<usize> {
    let numel: usize = out.iter().product();
    let off = out.len() - inp.len();
    (0..numel)
        .map(|i| {
            let c = coords(i, out);
            let ic: Vec<usize> = inp
                .iter()
                .enumerate()
                .map(|(k, &d)| if d == 1 { 0 } else { c[off + k] })
                .collect();
            flat(&ic, inp)
        })
        .collect()
}

/// An axis attribute in `-rank..rank`, normalized.
pub(super) fn axis(node: &Node, a: i64, rank: usize) -> R<usize> {
    let r = rank as i64;
    if a < -r || a >= r {
        return Err(node.err(
            format!("axis {a} is out of range for rank {rank}"),
            "the file is malformed",
        ));
    }
    Ok(if a < 0 { (a + r) as usize } else { a as usize })
}

/// ONNX `Flatten`'s output shape `[prod(shape[..axis]), prod(shape[axis..])]` and the axis,
/// which lies in `-rank..=rank`, a negative one counting from the back (-1: all but the
/// last dim in the first output dim).
pub(super) fn flattened(node: &Node, shape: &[usize]) -> R<(Vec<usize>, usize)> {
    let (a, r) = (node.int("axis", 1), shape.len() as i64);
    if a < -r || a > r {
        return Err(node.err(
            format!("Flatten axis {a} is out of range for rank {r}"),
            "the file is malformed",
        ));
    }
    let ax = if a < 0 { a + r } else { a } as usize;
    let out = vec![shape[..ax].iter().product(), shape[ax..].iter().product()];
    Ok((out, ax))
}

/// ONNX `Reshape` target resolution: 0 copies the input dim, -1 is inferred.
pub(super) fn reshape_target(node: &Node, input: &[usize], target: &[i64]) -> R<Vec<usize>> {
    let numel: usize = input.iter().product();
    let mut out = Vec::new();
    let mut infer = None;
    for (i, &t) in target.iter().enumerate() {
        match t {
            0 if node.int("allowzero", 0) == 0 => out.push(input.get(i).copied().unwrap_or(0)),
            -1 if infer.is_none() => {
                infer = Some(i);
                out.push(1);
            }
            t if t >= 0 => out.push(t as usize),
            _ => {
                return Err(node.err(
                    format!("reshape target {target:?} is invalid"),
                    "use positive dims, 0 (copy) and at most one -1",
                ))
            }
        }
    }
    let known: usize = out.iter().product();
    if let Some(i) = infer {
        if known == 0 || !numel.is_multiple_of(known) {
            return Err(node.err(
                format!("cannot reshape {input:?} to {target:?}"),
                "the element counts differ",
            ));
        }
        out[i] = numel / known;
    }
    if out.iter().product::<usize>() != numel {
        return Err(node.err(
            format!("cannot reshape {input:?} to {target:?}"),
            "the element counts differ",
        ));
    }
    Ok(out)
}

/// The axes of Unsqueeze/Squeeze/ReduceX: an attribute before opset 13, else input 1.
pub(super) fn axes_arg(node: &Node, env: &Env) -> R<Option<Vec<i64>>> {
    if node.opset < 13 {
        return Ok(node.ints("axes"));
    }
    match node.input_name(1) {
        Some(_) => Ok(Some(node.konst(env, 1)?.ints())),
        None => Ok(None),
    }
}

/// Shape after `Unsqueeze` with `axes`.
pub(super) fn unsqueezed(node: &Node, shape: &[usize], axes: &[i64]) -> R<Vec<usize>> {
    let rank = shape.len() + axes.len();
    let mut ax = Vec::new();
    for &a in axes {
        ax.push(axis(node, a, rank)?);
    }
    let mut it = shape.iter();
    Ok((0..rank)
        .map(|k| {
            if ax.contains(&k) {
                1
            } else {
                it.next().copied().unwrap_or(1)
            }
        })
        .collect())
}

/// Shape after `Squeeze` with `axes` (all unit dims when `None`).
pub(super) fn squeezed(node: &Node, shape: &[usize], axes: Option<&[i64]>) -> R<Vec<usize>> {
    let mut ax = Vec::new();
    for &a in axes.unwrap_or_default() {
        ax.push(axis(node, a, shape.len())?);
    }
    Ok(shape
        .iter()
        .enumerate()
        .filter(|&(k, &d)| {
            !(if axes.is_some() {
                ax.contains(&k)
            } else {
                d == 1
            })
        })
        .map(|(_, &d)| d)
        .collect())
}

/// True when `perm` holds each of `0..rank` once.
fn is_permutation(perm: &[usize], rank: usize) -> bool {
    let mut seen = vec![false; rank];
    perm.len() == rank
        && perm
            .iter()
            .all(|&p| p < rank && !std::mem::replace(&mut seen[p], true))
}

/// A Transpose node's `perm` over `rank` axes (reversed when absent), checked to be a
/// permutation.
pub(super) fn transpose_perm(node: &Node, rank: usize) -> R<Vec<usize>> {
    let perm: Vec<usize> = match node.ints("perm") {
        Some(p) => p.iter().map(|&a| axis(node, a, rank)).collect::<R<_>>()?,
        None => (0..rank).rev().collect(),
    };
    if !is_permutation(&perm, rank) {
        return Err(node.err(
            format!("perm {perm:?} is not a permutation of {rank} axes"),
            "the file is malformed",
        ));
    }
    Ok(perm)
}

/// `Slice`'s `(start, end, step)` per dim of `shape`, from its attributes (opset < 10) or
/// constant inputs: negative indices counted from the end and clamped as ONNX clamps them
/// (to `-1..=d-1` for a negative step), every other dim whole.
pub(super) fn slice_ranges(node: &Node, env: &Env, shape: &[usize]) -> R<Vec<(i64, i64, i64)>> {
    let rank = shape.len();
    let list = |i: usize, attr: &str| -> R<Option<Vec<i64>>> {
        if node.opset < 10 {
            return Ok(node.ints(attr));
        }
        match node.input_name(i) {
            Some(_) => Ok(Some(node.konst(env, i)?.ints())),
            None => Ok(None),
        }
    };
    let starts = list(1, "starts")?.unwrap_or_default();
    let ends = list(2, "ends")?.unwrap_or_default();
    let axes = list(3, "axes")?.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = list(4, "steps")?.unwrap_or_else(|| vec![1; starts.len()]);
    if [ends.len(), axes.len(), steps.len()] != [starts.len(); 3] {
        return Err(node.err(
            "starts, ends, axes and steps differ in length",
            "the file is malformed",
        ));
    }
    let mut ranges: Vec<(i64, i64, i64)> = shape.iter().map(|&d| (0, d as i64, 1)).collect();
    for (k, &a) in axes.iter().enumerate() {
        let ax = axis(node, a, rank)?;
        let d = shape[ax] as i64;
        let step = steps.get(k).copied().unwrap_or(1);
        if step == 0 {
            return Err(node.err("a slice step is 0", "the file is malformed"));
        }
        let norm = |v: i64, lo: i64, hi: i64| (if v < 0 { v + d } else { v }).clamp(lo, hi);
        let (s, e) = if step > 0 {
            (
                norm(starts[k], 0, d),
                norm(ends.get(k).copied().unwrap_or(d), 0, d),
            )
        } else {
            (
                norm(starts[k], -1, d - 1),
                norm(ends.get(k).copied().unwrap_or(-d - 1), -1, d - 1),
            )
        };
        ranges[ax] = (s, e, step);
    }
    Ok(ranges)
}
