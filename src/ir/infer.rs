//! Shape and dtype inference: the type of an op's output from its inputs' types, or why the
//! inputs are invalid for it. The graph builder and the verifier both call [`infer`].

use super::types::{broadcast, numel, ShapeDisplay};
use super::{AttnInput, ConvParams, DType, NormKind, Op, PoolParams, TensorType};

/// Why an op cannot take the given inputs; `message` names the offending shapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeError {
    pub message: String,
    pub help: String,
}

type Result<T> = std::result::Result<T, TypeError>;

fn fail<T>(message: impl Into<String>, help: impl Into<String>) -> Result<T> {
    Err(TypeError {
        message: message.into(),
        help: help.into(),
    })
}

fn arity(op: &Op, inputs: &[&TensorType], lo: usize, hi: usize) -> Result<()> {
    if inputs.len() < lo || inputs.len() > hi {
        let want = if lo == hi {
            format!("{lo}")
        } else {
            format!("{lo} to {hi}")
        };
        return fail(
            format!("`{}` takes {want} inputs, got {}", op.name(), inputs.len()),
            "check the number of arguments",
        );
    }
    Ok(())
}

fn float(t: &TensorType, what: &str) -> Result<()> {
    if !t.dtype.is_float() {
        return fail(
            format!("{what} must be a floating tensor, found {t}"),
            "integer tensors can only be ids or targets",
        );
    }
    Ok(())
}

fn scalar_f32(t: &TensorType, what: &str) -> Result<()> {
    if t.dtype != DType::F32 || t.numel() != 1 {
        return fail(
            format!("{what} must be one f32 element, found {t}"),
            "loss scaling state is a single fp32 value",
        );
    }
    Ok(())
}

fn same_dtype(a: &TensorType, b: &TensorType) -> Result<()> {
    if a.dtype != b.dtype {
        return fail(
            format!("dtype clash: {a} and {b}"),
            "both operands must have the same element type",
        );
    }
    Ok(())
}

fn rank_at_least(t: &TensorType, rank: usize, what: &str) -> Result<()> {
    if t.shape.len() < rank {
        return fail(
            format!("{what} needs rank >= {rank}, found {t}"),
            "reshape the tensor first",
        );
    }
    Ok(())
}

fn rank_exactly(t: &TensorType, rank: usize, what: &str) -> Result<()> {
    if t.shape.len() != rank {
        return fail(
            format!("{what} needs rank {rank}, found {t}"),
            "reshape the tensor first",
        );
    }
    Ok(())
}

fn same_shape(a: &TensorType, b: &TensorType, what: &str) -> Result<()> {
    if a.shape != b.shape {
        return fail(
            format!("shape mismatch in {what}: {a} vs {b}"),
            "both tensors must have the same shape",
        );
    }
    Ok(())
}

fn int(t: &TensorType, what: &str) -> Result<()> {
    if t.dtype != DType::I32 {
        return fail(
            format!("{what} must be i32, found {t}"),
            "declare it as `input name: i32[...]`",
        );
    }
    Ok(())
}

/// Channel count the affine parameters of a normalization have for input shape `x`.
pub fn norm_channels(kind: NormKind, x: &[usize]) -> usize {
    match kind {
        NormKind::Layer | NormKind::Rms => x.last().copied().unwrap_or(1),
        NormKind::Batch | NormKind::Group(_) => x.get(1).copied().unwrap_or(1),
    }
}

/// Output spatial size of a window op: `(n + 2p - d(k-1) - 1) / s + 1`, or None if empty.
pub fn window_out(n: usize, k: usize, s: usize, p: usize, d: usize) -> Option<usize> {
    let span = d * (k.max(1) - 1) + 1;
    let padded = n + 2 * p;
    (padded >= span && s > 0).then(|| (padded - span) / s + 1)
}

fn conv_out(x: &TensorType, w: &TensorType, c: &ConvParams) -> Result<TensorType> {
    rank_exactly(x, 4, "conv2d input")?;
    rank_exactly(w, 4, "conv2d weight")?;
    let (n, ci, h, wd) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let (co, cig, kh, kw) = (w.shape[0], w.shape[1], w.shape[2], w.shape[3]);
    if c.groups == 0 || ci != cig * c.groups || co % c.groups != 0 {
        return fail(
            format!(
                "conv2d channel mismatch: input {x} has {ci} channels, weight {w} expects {cig} x groups {}",
                c.groups
            ),
            "the weight must be [out, in/groups, kh, kw] with out divisible by groups",
        );
    }
    let ho = window_out(h, kh, c.stride[0], c.padding[0], c.dilation[0]);
    let wo = window_out(wd, kw, c.stride[1], c.padding[1], c.dilation[1]);
    match (ho, wo) {
        (Some(ho), Some(wo)) => Ok(TensorType::new(x.dtype, vec![n, co, ho, wo])),
        _ => fail(
            format!("conv2d kernel {kh}x{kw} does not fit input {x}"),
            "reduce the kernel, dilation or stride, or add padding",
        ),
    }
}

/// A conv2d gradient `dy` must have the shape the forward conv of `x` and `w` produces.
fn conv_grad_check(dy: &TensorType, x: &TensorType, w: &TensorType, c: &ConvParams) -> Result<()> {
    let y = conv_out(x, w, c)?;
    if y.shape != dy.shape {
        return fail(
            format!("conv2d gradient {dy} does not match the forward output {y}"),
            "the gradient must have the shape of the convolution's output",
        );
    }
    Ok(())
}

fn pool_out(x: &TensorType, p: &PoolParams) -> Result<TensorType> {
    rank_exactly(x, 4, "pooling input")?;
    let ho = window_out(x.shape[2], p.kernel[0], p.stride[0], p.padding[0], 1);
    let wo = window_out(x.shape[3], p.kernel[1], p.stride[1], p.padding[1], 1);
    if p.padding[0] * 2 > p.kernel[0] || p.padding[1] * 2 > p.kernel[1] {
        return fail(
            format!(
                "pool padding {:?} is more than half the kernel {:?}",
                p.padding, p.kernel
            ),
            "padding must be at most kernel / 2",
        );
    }
    match (ho, wo) {
        (Some(ho), Some(wo)) => Ok(TensorType::new(
            x.dtype,
            vec![x.shape[0], x.shape[1], ho, wo],
        )),
        _ => fail(
            format!("pool window {:?} does not fit input {x}", p.kernel),
            "use a smaller kernel or add padding",
        ),
    }
}

fn attention_check(
    q: &TensorType,
    k: &TensorType,
    v: &TensorType,
    heads: usize,
    kv: usize,
) -> Result<usize> {
    for (t, what) in [(q, "q"), (k, "k"), (v, "v")] {
        rank_exactly(t, 3, &format!("attention {what}"))?;
        float(t, &format!("attention {what}"))?;
    }
    same_shape(k, v, "attention k/v")?;
    if heads == 0 || kv == 0 || !heads.is_multiple_of(kv) || !q.shape[2].is_multiple_of(heads) {
        return fail(
            format!("attention with {heads} heads and {kv} kv heads does not divide q {q}"),
            "heads must divide the model width, and kv_heads must divide heads",
        );
    }
    let dh = q.shape[2] / heads;
    if q.shape[0] != k.shape[0] || k.shape[2] != kv * dh {
        return fail(
            format!(
                "attention shapes disagree: q {q}, k {k} (expected k width {})",
                kv * dh
            ),
            "k and v need batch of q and kv_heads x head_dim columns",
        );
    }
    Ok(dh)
}

fn matmul_out(a: &TensorType, b: &TensorType, ta: bool, tb: bool) -> Result<TensorType> {
    rank_at_least(a, 2, "matmul operand")?;
    rank_at_least(b, 2, "matmul operand")?;
    float(a, "matmul operand")?;
    same_dtype(a, b)?;
    let (ra, rb) = (a.shape.len(), b.shape.len());
    let (m, ka) = if ta {
        (a.shape[ra - 1], a.shape[ra - 2])
    } else {
        (a.shape[ra - 2], a.shape[ra - 1])
    };
    let (kb, n) = if tb {
        (b.shape[rb - 1], b.shape[rb - 2])
    } else {
        (b.shape[rb - 2], b.shape[rb - 1])
    };
    if ka != kb {
        return fail(
            format!("shape mismatch in matmul: {a} @ {b} (inner dims {ka} and {kb})"),
            "the last dim of the left operand must equal the second-to-last of the right",
        );
    }
    let Some(mut batch) = broadcast(&a.shape[..ra - 2], &b.shape[..rb - 2]) else {
        return fail(
            format!("matmul batch dims do not broadcast: {a} @ {b}"),
            "batch dims must be equal or 1",
        );
    };
    batch.extend([m, n]);
    Ok(TensorType::new(a.dtype, batch))
}

/// The output type of `op` applied to inputs of the given types, by its family's rule.
pub fn infer(op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
    crate::ops::family(op).infer(op, inputs)
}

pub(crate) fn infer_legacy(op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
    use Op::*;
    let at = |i: usize| inputs[i];
    match op {
        Input { ty, .. } | Param { ty, .. } | OptimState { ty, .. } | Fill { ty, .. } => {
            arity(op, inputs, 0, 0)?;
            Ok(ty.clone())
        }
        Unary(_) | Affine { .. } | Dropout { .. } => {
            arity(op, inputs, 1, 1)?;
            float(at(0), "operand")?;
            if let Dropout { p, .. } = op {
                if !(0.0..1.0).contains(p) {
                    return fail(
                        format!("dropout p = {p} is outside [0, 1)"),
                        "use 0 <= p < 1",
                    );
                }
            }
            Ok(at(0).clone())
        }
        UnaryBackward(_) | SoftmaxBackward { .. } | LogSoftmaxBackward { .. } => {
            arity(op, inputs, 2, 2)?;
            same_shape(at(0), at(1), op.name())?;
            Ok(at(0).clone())
        }
        Binary(_) => {
            arity(op, inputs, 2, 2)?;
            float(at(0), "operand")?;
            same_dtype(at(0), at(1))?;
            match broadcast(&at(0).shape, &at(1).shape) {
                Some(shape) => Ok(TensorType::new(at(0).dtype, shape)),
                None => fail(
                    format!("shapes do not broadcast: {} and {}", at(0), at(1)),
                    "dims must be equal or 1, aligned from the right",
                ),
            }
        }
        SumTo { shape } => {
            arity(op, inputs, 1, 1)?;
            match broadcast(shape, &at(0).shape) {
                Some(b) if b == at(0).shape => Ok(TensorType::new(at(0).dtype, shape.clone())),
                _ => fail(
                    format!("cannot reduce {} to {}", at(0), ShapeDisplay(shape)),
                    "the target must broadcast to the input",
                ),
            }
        }
        BroadcastTo { shape } => {
            arity(op, inputs, 1, 1)?;
            match broadcast(&at(0).shape, shape) {
                Some(b) if &b == shape => Ok(TensorType::new(at(0).dtype, shape.clone())),
                _ => fail(
                    format!("cannot broadcast {} to {}", at(0), ShapeDisplay(shape)),
                    "dims must be equal or 1, aligned from the right",
                ),
            }
        }
        MaxTo { shape } => {
            arity(op, inputs, 1, 1)?;
            let ok = shape.len() == at(0).shape.len()
                && shape
                    .iter()
                    .zip(&at(0).shape)
                    .all(|(&s, &x)| s == x || s == 1);
            if !ok {
                return fail(
                    format!("cannot max-reduce {} to {}", at(0), ShapeDisplay(shape)),
                    "keep the rank; reduced dims become 1",
                );
            }
            Ok(TensorType::new(at(0).dtype, shape.clone()))
        }
        MaxToBackward => {
            arity(op, inputs, 3, 3)?;
            same_shape(at(1), at(2), op.name())?;
            Ok(at(0).clone())
        }
        Softmax { axis } | LogSoftmax { axis } => {
            arity(op, inputs, 1, 1)?;
            float(at(0), "operand")?;
            if *axis >= at(0).shape.len() {
                return fail(
                    format!("axis {axis} out of range for {}", at(0)),
                    "use an axis below the rank",
                );
            }
            Ok(at(0).clone())
        }
        Norm { kind, .. } => {
            arity(op, inputs, 2, 3)?;
            let x = at(0);
            float(x, "normalized input")?;
            let min_rank = if matches!(kind, NormKind::Layer | NormKind::Rms) {
                1
            } else {
                2
            };
            rank_at_least(x, min_rank, "normalization input")?;
            let c = norm_channels(*kind, &x.shape);
            if let NormKind::Group(g) = kind {
                if *g == 0 || !c.is_multiple_of(*g) {
                    return fail(
                        format!("groupnorm with {g} groups does not divide {c} channels of {x}"),
                        "choose a group count that divides the channels",
                    );
                }
            }
            for p in &inputs[1..] {
                if p.shape != [c] {
                    return fail(
                        format!("normalization parameter {p} does not match {c} channels of {x}"),
                        format!("declare it with {c} channels"),
                    );
                }
            }
            Ok(x.clone())
        }
        NormBackwardInput { .. } => {
            arity(op, inputs, 3, 3)?;
            same_shape(at(0), at(2), op.name())?;
            Ok(at(0).clone())
        }
        NormBackwardWeight { kind, .. } => {
            arity(op, inputs, 2, 2)?;
            same_shape(at(0), at(1), op.name())?;
            Ok(TensorType::new(
                at(0).dtype,
                vec![norm_channels(*kind, &at(0).shape)],
            ))
        }
        NormBackwardBias { kind } => {
            arity(op, inputs, 1, 1)?;
            Ok(TensorType::new(
                at(0).dtype,
                vec![norm_channels(*kind, &at(0).shape)],
            ))
        }
        Embedding => {
            arity(op, inputs, 2, 2)?;
            rank_exactly(at(0), 2, "embedding table")?;
            float(at(0), "embedding table")?;
            int(at(1), "embedding ids")?;
            let mut shape = at(1).shape.clone();
            shape.push(at(0).shape[1]);
            Ok(TensorType::new(at(0).dtype, shape))
        }
        EmbeddingBackward { rows } => {
            arity(op, inputs, 2, 2)?;
            let d = at(1).shape.last().copied().unwrap_or(1);
            Ok(TensorType::new(at(1).dtype, vec![*rows, d]))
        }
        CrossEntropy => {
            arity(op, inputs, 2, 2)?;
            let (logits, targets) = (at(0), at(1));
            rank_at_least(logits, 1, "cross_entropy logits")?;
            float(logits, "cross_entropy logits")?;
            int(targets, "cross_entropy targets")?;
            if targets.shape != logits.shape[..logits.shape.len() - 1] {
                return fail(
                    format!("cross_entropy targets {targets} do not match logits {logits}"),
                    "targets must have the logits' shape without the class dim",
                );
            }
            Ok(TensorType::new(DType::F32, vec![]))
        }
        CrossEntropyBackward => {
            arity(op, inputs, 3, 3)?;
            Ok(at(0).clone())
        }
        Mse => {
            arity(op, inputs, 2, 2)?;
            float(at(0), "mse operand")?;
            same_dtype(at(0), at(1))?;
            same_shape(at(0), at(1), "mse")?;
            Ok(TensorType::new(DType::F32, vec![]))
        }
        MseBackward => {
            arity(op, inputs, 3, 3)?;
            Ok(at(0).clone())
        }
        Reshape { shape } => {
            arity(op, inputs, 1, 1)?;
            if numel(shape) != at(0).numel() {
                return fail(
                    format!(
                        "cannot reshape {} ({} elements) to {}",
                        at(0),
                        at(0).numel(),
                        ShapeDisplay(shape)
                    ),
                    "the element count must stay the same",
                );
            }
            Ok(TensorType::new(at(0).dtype, shape.clone()))
        }
        Permute { perm } => {
            arity(op, inputs, 1, 1)?;
            let rank = at(0).shape.len();
            let mut seen = vec![false; rank];
            let valid = perm.len() == rank
                && perm
                    .iter()
                    .all(|&p| p < rank && !std::mem::replace(&mut seen[p], true));
            if !valid {
                return fail(
                    format!(
                        "{perm:?} is not a permutation of the {rank} dims of {}",
                        at(0)
                    ),
                    "list every axis exactly once",
                );
            }
            let shape = perm.iter().map(|&p| at(0).shape[p]).collect();
            Ok(TensorType::new(at(0).dtype, shape))
        }
        Slice { axis, start, end } => {
            arity(op, inputs, 1, 1)?;
            let x = at(0);
            match x.shape.get(*axis) {
                Some(&d) if start < end && *end <= d => {
                    let mut shape = x.shape.clone();
                    shape[*axis] = end - start;
                    Ok(TensorType::new(x.dtype, shape))
                }
                _ => fail(
                    format!("slice {start}..{end} on axis {axis} is out of range for {x}"),
                    "slice within the dim's extent",
                ),
            }
        }
        PadSlice { axis, start, full } => {
            arity(op, inputs, 1, 1)?;
            let mut shape = at(0).shape.clone();
            match shape.get_mut(*axis) {
                Some(d) if start + *d <= *full => *d = *full,
                _ => return fail(format!("pad_slice out of range for {}", at(0)), "internal"),
            }
            Ok(TensorType::new(at(0).dtype, shape))
        }
        Concat { axis } => {
            arity(op, inputs, 1, usize::MAX)?;
            let first = at(0);
            let mut shape = first.shape.clone();
            if *axis >= shape.len() {
                return fail(
                    format!("concat axis {axis} out of range for {first}"),
                    "use an axis below the rank",
                );
            }
            shape[*axis] = 0;
            for t in inputs {
                same_dtype(first, t)?;
                let compatible = t.shape.len() == first.shape.len()
                    && t.shape
                        .iter()
                        .zip(&first.shape)
                        .enumerate()
                        .all(|(i, (a, b))| i == *axis || a == b);
                if !compatible {
                    return fail(
                        format!("concat along axis {axis}: {first} and {t} differ in another dim"),
                        "all parts must agree except along the concat axis",
                    );
                }
                shape[*axis] += t.shape[*axis];
            }
            Ok(TensorType::new(first.dtype, shape))
        }
        MatMul { ta, tb } => {
            arity(op, inputs, 2, 2)?;
            matmul_out(at(0), at(1), *ta, *tb)
        }
        Conv2d(c) => {
            arity(op, inputs, 2, 2)?;
            float(at(0), "conv2d input")?;
            same_dtype(at(0), at(1))?;
            conv_out(at(0), at(1), c)
        }
        Conv2dBackwardInput { conv, input } => {
            arity(op, inputs, 2, 2)?;
            let (dy, w) = (at(0), at(1));
            rank_exactly(dy, 4, "conv2d gradient")?;
            rank_exactly(w, 4, "conv2d weight")?;
            let dx = TensorType::new(
                dy.dtype,
                vec![dy.shape[0], w.shape[1] * conv.groups, input[0], input[1]],
            );
            conv_grad_check(dy, &dx, w, conv)?;
            Ok(dx)
        }
        Conv2dBackwardWeight { conv, kernel } => {
            arity(op, inputs, 2, 2)?;
            let (x, dy) = (at(0), at(1));
            rank_exactly(x, 4, "conv2d input")?;
            rank_exactly(dy, 4, "conv2d gradient")?;
            let dw = TensorType::new(
                x.dtype,
                vec![dy.shape[1], x.shape[1] / conv.groups, kernel[0], kernel[1]],
            );
            conv_grad_check(dy, x, &dw, conv)?;
            Ok(dw)
        }
        MaxPool2d(p) | AvgPool2d(p) => {
            arity(op, inputs, 1, 1)?;
            float(at(0), "pooling input")?;
            pool_out(at(0), p)
        }
        MaxPool2dBackward(_) => {
            arity(op, inputs, 2, 2)?;
            Ok(at(0).clone())
        }
        AvgPool2dBackward { input, .. } => {
            arity(op, inputs, 1, 1)?;
            let dy = at(0);
            rank_exactly(dy, 4, "pooling gradient")?;
            Ok(TensorType::new(
                dy.dtype,
                vec![dy.shape[0], dy.shape[1], input[0], input[1]],
            ))
        }
        Attention(a) => {
            arity(op, inputs, 3, 3)?;
            attention_check(at(0), at(1), at(2), a.heads, a.kv_heads)?;
            Ok(at(0).clone())
        }
        AttentionBackward { which, .. } => {
            arity(op, inputs, 4, 4)?;
            Ok(match which {
                AttnInput::Q => at(0).clone(),
                AttnInput::K => at(1).clone(),
                AttnInput::V => at(2).clone(),
            })
        }
        Rope { heads, .. } => {
            arity(op, inputs, 1, 1)?;
            let x = at(0);
            rank_exactly(x, 3, "rope input")?;
            float(x, "rope input")?;
            if *heads == 0 || x.shape[2] % heads != 0 || (x.shape[2] / heads) % 2 != 0 {
                return fail(
                    format!("rope with {heads} heads needs an even head dim dividing {x}"),
                    "heads must divide the width into even head dims",
                );
            }
            Ok(x.clone())
        }
        Cast { to } => {
            arity(op, inputs, 1, 1)?;
            float(at(0), "a cast's input")?;
            if !to.is_float() {
                return fail(
                    format!("cannot cast {} to {to}", at(0)),
                    "casts convert between floating types",
                );
            }
            Ok(at(0).with_dtype(*to))
        }
        ClipCoefficient { scaled, .. } => {
            arity(op, inputs, 1 + usize::from(*scaled), usize::MAX)?;
            Ok(TensorType::new(DType::F32, vec![]))
        }
        UnscaleGrads => {
            arity(op, inputs, 2, usize::MAX)?;
            scalar_f32(at(0), "the loss scale")?;
            Ok(TensorType::new(DType::F32, vec![]))
        }
        AccumulateGrad { micro_steps } => {
            arity(op, inputs, 2, 2)?;
            if at(0).dtype != DType::F32 {
                return fail(
                    format!("gradient accumulator {} must be f32", at(0)),
                    "gradients accumulate in fp32",
                );
            }
            float(at(1), "an accumulated gradient")?;
            same_shape(at(0), at(1), op.name())?;
            if *micro_steps == 0 {
                return fail(
                    "gradient accumulation over 0 micro-steps",
                    "accumulate over at least one micro-batch",
                );
            }
            Ok(TensorType::new(DType::F32, vec![0]))
        }
        LossScaleUpdate { .. } => {
            arity(op, inputs, 3, 3)?;
            for (i, what) in ["the loss scale", "the clean-step count", "the multiplier"]
                .into_iter()
                .enumerate()
            {
                scalar_f32(at(i), what)?;
            }
            Ok(TensorType::new(DType::F32, vec![0]))
        }
        AdamW(_) | Sgd(_) => {
            let state = if matches!(op, AdamW(_)) { 4 } else { 3 };
            arity(op, inputs, state, state + 1)?;
            for t in &inputs[1..state] {
                same_shape(at(0), t, op.name())?;
            }
            Ok(TensorType::new(DType::F32, vec![0]))
        }
    }
}
