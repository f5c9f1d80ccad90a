//! Shape and dtype rule, cost and precision class of the N-d convolution, its backward ops
//! and the transposed convolution.

use super::ConvParams;
use crate::ir::{Op, TensorType};
use crate::ops::rules::{
    arity, fail, float, foreign, same_dtype, window_out, Behaviour, PrecisionClass, Result, Rules,
};

/// The op's name for messages: `conv1d`, `conv2d` or `conv3d`.
fn conv_name(c: &ConvParams) -> String {
    format!("conv{}d", c.rank())
}

/// Fails unless `c` has 1 to 3 spatial dimensions, each list of that length, and `a` and `b`
/// (named by `what`) both have rank `2 + c.rank()`.
fn ranks(a: &TensorType, b: &TensorType, c: &ConvParams, what: [&str; 2]) -> Result<()> {
    let r = c.rank();
    if !(1..=3).contains(&r) || c.padding.len() != r || c.dilation.len() != r {
        return fail(
            format!(
                "convolution geometry has {} strides, {} paddings and {} dilations",
                r,
                c.padding.len(),
                c.dilation.len()
            ),
            "give one stride, padding and dilation per spatial dimension (1 to 3)",
        );
    }
    let name = conv_name(c);
    let layout = ["NCL", "NCHW", "NCDHW"][r - 1];
    for (t, what) in [(a, what[0]), (b, what[1])] {
        if t.shape.len() != r + 2 {
            return fail(
                format!("{name} {what} needs rank {}, found {t}", r + 2),
                format!("{name} works on {layout} tensors; use the convolution of the tensor's spatial rank"),
            );
        }
    }
    Ok(())
}

/// The output of convolving `x[N, C, spatial...]` by `w[O, C/g, kernel...]`.
fn conv_out(x: &TensorType, w: &TensorType, c: &ConvParams) -> Result<TensorType> {
    ranks(x, w, c, ["input", "weight"])?;
    let name = conv_name(c);
    let (ci, co, cig) = (x.shape[1], w.shape[0], w.shape[1]);
    if c.groups == 0 || ci != cig * c.groups || co % c.groups != 0 {
        return fail(
            format!(
                "{name} channel mismatch: input {x} has {ci} channels, weight {w} expects {cig} x groups {}",
                c.groups
            ),
            "the weight must be [out, in/groups, kernel...] with out divisible by groups",
        );
    }
    let mut shape = vec![x.shape[0], co];
    for d in 0..c.rank() {
        let k = w.shape[2 + d];
        match window_out(x.shape[2 + d], k, c.stride[d], c.padding[d], c.dilation[d]) {
            Some(o) if k > 0 => shape.push(o),
            _ => {
                return fail(
                    format!("{name} kernel {:?} does not fit input {x}", &w.shape[2..]),
                    "reduce the kernel, dilation or stride, or add padding",
                )
            }
        }
    }
    Ok(TensorType::new(x.dtype, shape))
}

/// A convolution gradient `dy` must have the shape the forward conv of `x` and `w` produces.
fn conv_grad_check(dy: &TensorType, x: &TensorType, w: &TensorType, c: &ConvParams) -> Result<()> {
    let y = conv_out(x, w, c)?;
    if y.shape != dy.shape {
        return fail(
            format!(
                "{} gradient {dy} does not match the forward output {y}",
                conv_name(c)
            ),
            "the gradient must have the shape of the convolution's output",
        );
    }
    Ok(())
}

/// `(dy, w) -> dx` with `dx` of spatial size `input`: the input gradient, and the transposed
/// convolution of `dy` by `w`.
fn backward_input(
    dy: &TensorType,
    w: &TensorType,
    conv: &ConvParams,
    input: &[usize],
) -> Result<TensorType> {
    ranks(dy, w, conv, ["gradient", "weight"])?;
    if input.len() != conv.rank() {
        return fail(
            format!(
                "{} output size {input:?} has the wrong rank",
                conv_name(conv)
            ),
            "give one size per spatial dimension",
        );
    }
    let mut shape = vec![dy.shape[0], w.shape[1] * conv.groups];
    shape.extend_from_slice(input);
    let dx = TensorType::new(dy.dtype, shape);
    conv_grad_check(dy, &dx, w, conv)?;
    Ok(dx)
}

/// `(x, dy) -> dw` with `dw` of spatial size `kernel`.
fn backward_weight(
    x: &TensorType,
    dy: &TensorType,
    conv: &ConvParams,
    kernel: &[usize],
) -> Result<TensorType> {
    ranks(x, dy, conv, ["input", "gradient"])?;
    if kernel.len() != conv.rank() {
        return fail(
            format!("{} kernel {kernel:?} has the wrong rank", conv_name(conv)),
            "give one kernel size per spatial dimension",
        );
    }
    let cig = x.shape[1].checked_div(conv.groups).unwrap_or(0);
    let mut shape = vec![dy.shape[1], cig];
    shape.extend_from_slice(kernel);
    let dw = TensorType::new(x.dtype, shape);
    conv_grad_check(dy, x, &dw, conv)?;
    Ok(dw)
}

/// Multiply-adds per output element of the convolution with weight `w`:
/// `C/g * prod(kernel)`.
fn per_output(w: &TensorType) -> u64 {
    w.shape[1..].iter().map(|&d| d as u64).product()
}

impl Rules for super::Family {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<TensorType> {
        match op {
            Op::Conv(c) => {
                arity(op, inputs, 2, 2)?;
                float(inputs[0], "convolution input")?;
                same_dtype(inputs[0], inputs[1])?;
                conv_out(inputs[0], inputs[1], c)
            }
            Op::ConvTranspose {
                conv,
                output: input,
            } => {
                arity(op, inputs, 2, 2)?;
                float(inputs[0], "transposed convolution input")?;
                same_dtype(inputs[0], inputs[1])?;
                backward_input(inputs[0], inputs[1], conv, input)
            }
            Op::ConvBackwardInput { conv, input } => {
                arity(op, inputs, 2, 2)?;
                backward_input(inputs[0], inputs[1], conv, input)
            }
            Op::ConvBackwardWeight { conv, kernel } => {
                arity(op, inputs, 2, 2)?;
                backward_weight(inputs[0], inputs[1], conv, kernel)
            }
            _ => foreign(op, "conv"),
        }
    }

    fn flops(&self, op: &Op, inputs: &[&TensorType], out: &TensorType) -> u64 {
        match op {
            Op::Conv(_) => 2 * out.numel() * per_output(inputs[1]),
            Op::ConvBackwardInput { .. } | Op::ConvTranspose { .. } => {
                2 * inputs[0].numel() * per_output(inputs[1])
            }
            Op::ConvBackwardWeight { .. } => 2 * inputs[1].numel() * per_output(out),
            _ => 0,
        }
    }

    fn behaviour(&self, op: &Op) -> Behaviour {
        match op {
            Op::Conv(_) | Op::ConvTranspose { .. } => {
                Behaviour::HEAVY.in_precision(PrecisionClass::Low)
            }
            _ => Behaviour::HEAVY,
        }
    }
}
