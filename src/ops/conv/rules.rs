//! Shape and dtype rule, cost and precision class of conv2d and its backward ops.

use super::ConvParams;
use crate::ir::{Op, TensorType};
use crate::ops::rules::{
    arity, fail, float, foreign, rank_exactly, same_dtype, window_out, Behaviour, PrecisionClass,
    Result, Rules,
};

/// Fails unless both operands `a` and `b` (named by `what`) have rank 4.
fn rank4(a: &TensorType, b: &TensorType, what: [&str; 2]) -> Result<()> {
    rank_exactly(a, 4, what[0])?;
    rank_exactly(b, 4, what[1])
}

/// The output of conv2d of `x[N, C, H, W]` by `w[O, C/g, KH, KW]`.
fn conv_out(x: &TensorType, w: &TensorType, c: &ConvParams) -> Result<TensorType> {
    rank4(x, w, ["conv2d input", "conv2d weight"])?;
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

/// `(dy, w) -> dx` with `dx` of spatial size `input`.
fn backward_input(
    dy: &TensorType,
    w: &TensorType,
    conv: &ConvParams,
    input: [usize; 2],
) -> Result<TensorType> {
    rank4(dy, w, ["conv2d gradient", "conv2d weight"])?;
    let dx = TensorType::new(
        dy.dtype,
        vec![dy.shape[0], w.shape[1] * conv.groups, input[0], input[1]],
    );
    conv_grad_check(dy, &dx, w, conv)?;
    Ok(dx)
}

/// `(x, dy) -> dw` with `dw` of spatial size `kernel`.
fn backward_weight(
    x: &TensorType,
    dy: &TensorType,
    conv: &ConvParams,
    kernel: [usize; 2],
) -> Result<TensorType> {
    rank4(x, dy, ["conv2d input", "conv2d gradient"])?;
    let cig = x.shape[1].checked_div(conv.groups).unwrap_or(0);
    let dw = TensorType::new(x.dtype, vec![dy.shape[1], cig, kernel[0], kernel[1]]);
    conv_grad_check(dy, x, &dw, conv)?;
    Ok(dw)
}

impl Rules for super::Family {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
        match op {
            Op::Conv2d(c) => {
                arity(op, inputs, 2, 2)?;
                float(inputs[0], "conv2d input")?;
                same_dtype(inputs[0], inputs[1])?;
                conv_out(inputs[0], inputs[1], c)
            }
            Op::Conv2dBackwardInput { conv, input } => {
                arity(op, inputs, 2, 2)?;
                backward_input(inputs[0], inputs[1], conv, *input)
            }
            Op::Conv2dBackwardWeight { conv, kernel } => {
                arity(op, inputs, 2, 2)?;
                backward_weight(inputs[0], inputs[1], conv, *kernel)
            }
            _ => foreign(op, "conv"),
        }
    }

    fn flops(&self, op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
        let volume = |t: &TensorType| (t.shape[1] * t.shape[2] * t.shape[3]) as u64;
        match op {
            Op::Conv2d(c) => {
                let g = c.groups.max(1) as u64;
                2 * out.numel() * volume(inputs[1]) / g * g
            }
            Op::Conv2dBackwardInput { .. } => 2 * inputs[0].numel() * volume(inputs[1]),
            Op::Conv2dBackwardWeight { .. } => 2 * inputs[1].numel() * volume(out),
            _ => 0,
        }
    }

    fn behaviour(&self, op: &Op) -> Behaviour {
        match op {
            Op::Conv2d(_) => Behaviour::HEAVY.in_precision(PrecisionClass::Low),
            _ => Behaviour::HEAVY,
        }
    }
}
