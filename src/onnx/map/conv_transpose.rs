//! ONNX `ConvTranspose` over NCL, NCHW and NCDHW as `.mdl` `conv_transpose1d` ..
//! `conv_transpose3d`. ONNX crops `begin` rows at the start of the full transposed
//! convolution and keeps `out` rows (from `pads`, or from `output_shape` and `auto_pad`);
//! memc's call crops `padding` rows at both ends and adds `output_padding` rows at the end,
//! so the crop becomes `padding = begin`, the `output_padding` that makes the size `out`,
//! and a `slice` where the end crop is larger than the start one.

use super::conv::{declare_and_call, geometry, weight_shape};
use super::R;
use crate::onnx::{Env, Node};

/// The per-axis crop of one `ConvTranspose` axis: rows cropped at the start, rows kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Crop {
    begin: usize,
    out: usize,
}

/// The `ConvTranspose` of the node's input 0 by its weight (constant, or computed at run
/// time), and the output shape.
pub(super) fn conv_transpose(
    node: &Node,
    env: &Env,
    w: &mut crate::onnx::write::Writer,
) -> R<(String, Vec<usize>)> {
    let x = super::operand(node, env, w, 0)?;
    let ws = weight_shape(node, env)?;
    let (n, groups, strides, dilations) = geometry(node, x.shape.len(), &ws)?;
    let (c, og) = (x.shape[1], ws[1]);
    if groups == 0 || ws[0] != c || c % groups != 0 {
        return Err(node.err(
            format!("weight shape {ws:?} with {groups} groups does not fit {c} input channels"),
            "the weight must be [C, M/group, kernel...]",
        ));
    }
    let extra = match node.ints("output_padding") {
        None => vec![0; n],
        Some(v) if v.len() == n && v.iter().all(|&a| a >= 0) => {
            v.iter().map(|&a| a as usize).collect()
        }
        Some(v) => {
            return Err(node.err(
                format!("attribute `output_padding` = {v:?} is not {n} non-negative values"),
                "give one value per spatial axis",
            ))
        }
    };
    // The full transposed convolution's length per axis, before any crop or extension.
    let full: Vec<usize> = (0..n)
        .map(|d| strides[d] * x.shape[2 + d].saturating_sub(1) + dilations[d] * (ws[2 + d] - 1) + 1)
        .collect();
    let crops = crops(node, &full, &extra, &x.shape[2..], &strides)?;
    let mut padding = Vec::with_capacity(n);
    let mut output_padding = Vec::with_capacity(n);
    let mut cuts = Vec::new();
    for d in 0..n {
        let Crop { begin, out } = crops[d];
        // memc's length is full + output_padding - 2 * padding: rows short of `out` come
        // from `output_padding`, rows beyond it are sliced off.
        let cropped = full[d].checked_sub(2 * begin).filter(|&l| l > 0);
        let e = cropped.map_or(0, |l| out.saturating_sub(l));
        if cropped.is_none() || e >= strides[d].max(dilations[d]) {
            return Err(node.err(
                format!(
                    "cropping {begin} at the start and keeping {out} of {} on spatial axis {d} has no memc form",
                    full[d]
                ),
                "memc imports transposed convolutions whose end crop is at least the start one less the stride",
            ));
        }
        if cropped.is_some_and(|l| l > out) {
            cuts.push((d + 2, out));
        }
        padding.push(begin);
        output_padding.push(e);
    }
    let kw = [
        ("stride", &strides[..], 1),
        ("padding", &padding[..], 0),
        ("output_padding", &output_padding[..], 0),
        ("dilation", &dilations[..], 1),
    ];
    let name = format!("conv_transpose{n}d");
    let mut call = declare_and_call(node, env, w, (&name, &x.expr), groups, &kw)?;
    for (axis, out) in cuts {
        call = format!("slice({call}, 0, {out}, axis = {axis})");
    }
    let mut shape = vec![x.shape[0], og * groups];
    shape.extend(crops.iter().map(|c| c.out));
    Ok((call, shape))
}

/// The crop per axis: from `pads` (begins then ends), or from `output_shape` (default: the
/// input times the stride under SAME) with the total padding split as ONNX states
/// (`SAME_UPPER` puts the odd row at the end, otherwise at the start).
fn crops(
    node: &Node,
    full: &[usize],
    extra: &[usize],
    input: &[usize],
    strides: &[usize],
) -> R<Vec<Crop>> {
    let n = full.len();
    let auto = node.string("auto_pad").unwrap_or_default();
    let pads = node.ints("pads");
    let shape = node.ints("output_shape");
    let bad = |what: String| {
        node.err(
            what,
            "give `pads` (NOTSET or VALID), or `output_shape` or SAME_UPPER / SAME_LOWER without `pads`",
        )
    };
    match auto.as_str() {
        "" | "NOTSET" | "VALID" | "SAME_UPPER" | "SAME_LOWER" => {}
        other => {
            return Err(bad(format!(
                "auto_pad = `{other}` is not an ONNX padding mode"
            )))
        }
    }
    let by_shape = shape.is_some() || auto.starts_with("SAME");
    if by_shape && pads.is_some() {
        return Err(bad(
            "both `pads` and `output_shape` or SAME padding are given".into(),
        ));
    }
    if !by_shape {
        let p = match (auto.as_str(), pads) {
            ("VALID", _) | (_, None) => vec![0; 2 * n],
            (_, Some(p)) => p,
        };
        if p.len() != 2 * n || p.iter().any(|&v| v < 0) {
            return Err(bad(format!(
                "attribute `pads` = {p:?} is not {} non-negative values",
                2 * n
            )));
        }
        return (0..n)
            .map(|d| {
                let (b, a) = (p[d] as usize, p[n + d] as usize);
                match (full[d] + extra[d]).checked_sub(b + a) {
                    Some(out) if out > 0 => Ok(Crop { begin: b, out }),
                    _ => Err(bad(format!(
                        "pads {p:?} leave no output on spatial axis {d}"
                    ))),
                }
            })
            .collect();
    }
    let want: Vec<i64> = match shape {
        Some(s) if s.len() == n && s.iter().all(|&v| v > 0) => s,
        Some(s) => {
            return Err(bad(format!(
                "attribute `output_shape` = {s:?} is not {n} positive sizes"
            )))
        }
        None => (0..n).map(|d| (input[d] * strides[d]) as i64).collect(),
    };
    (0..n)
        .map(|d| {
            let total = (full[d] + extra[d]) as i64 - want[d];
            let begin = if auto == "SAME_UPPER" {
                total.div_euclid(2)
            } else {
                total - total.div_euclid(2)
            };
            match usize::try_from(begin) {
                Ok(begin) => Ok(Crop {
                    begin,
                    out: want[d] as usize,
                }),
                Err(_) => Err(bad(format!(
                    "output_shape {want:?} puts rows before the start on spatial axis {d}"
                ))),
            }
        })
        .collect()
}
