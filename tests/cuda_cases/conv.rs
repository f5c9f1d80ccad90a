//! Convolution cases: 1-D, 2-D and 3-D convolutions with their input and weight gradients,
//! transposed convolutions, and batch and group norm over NCDHW volumes, each at a size with
//! grouping, stride, padding and dilation differing between axes, and a 2-D convolution whose
//! forward and input gradient split their K.

use super::t;
use memc::ir::*;

/// A convolution geometry with `groups` and one stride, padding and dilation per axis.
fn geometry(stride: &[usize], padding: &[usize], dilation: &[usize], groups: usize) -> ConvParams {
    ConvParams {
        stride: stride.to_vec(),
        padding: padding.to_vec(),
        dilation: dilation.to_vec(),
        groups,
    }
}

/// The convolution `conv` of `x` by `w` (output `y`), its input and weight gradients, named
/// `{name}`, `{name}_bwd_in`, `{name}_bwd_w`.
fn with_gradients(
    names: [&'static str; 3],
    conv: ConvParams,
    [x, w, y]: [&[usize]; 3],
) -> Vec<(&'static str, Op, Vec<TensorType>)> {
    let f = |s: &[usize]| t(DType::F32, s);
    vec![
        (names[0], Op::Conv(conv.clone()), vec![f(x), f(w)]),
        (
            names[1],
            Op::ConvBackwardInput {
                conv: conv.clone(),
                input: x[2..].to_vec(),
            },
            vec![f(y), f(w)],
        ),
        (
            names[2],
            Op::ConvBackwardWeight {
                conv,
                kernel: w[2..].to_vec(),
            },
            vec![f(x), f(y)],
        ),
    ]
}

/// The convolution cases, as `super::cases` lists them.
pub fn cases() -> Vec<(&'static str, Op, Vec<TensorType>)> {
    let f = |s: &[usize]| t(DType::F32, s);
    let mut cases = with_gradients(
        ["conv2d", "conv2d_bwd_in", "conv2d_bwd_w"],
        geometry(&[2, 1], &[1, 1], &[1, 2], 2),
        [&[2, 4, 9, 9], &[6, 2, 3, 3], &[2, 6, 5, 7]],
    );
    cases.extend(with_gradients(
        ["conv1d", "conv1d_bwd_in", "conv1d_bwd_w"],
        geometry(&[2], &[2], &[2], 2),
        [&[2, 4, 19], &[6, 2, 3], &[2, 6, 10]],
    ));
    // Few output tiles over a long K: the forward and the input gradient split K in four
    // (two-stage, fp32 partials), the weight gradient (K = 36) does not.
    cases.extend(with_gradients(
        ["conv2d_split", "conv2d_split_bwd_in", "conv2d_split_bwd_w"],
        geometry(&[1, 1], &[1, 1], &[1, 1], 1),
        [&[1, 32, 6, 6], &[32, 32, 3, 3], &[1, 32, 6, 6]],
    ));
    // D: stride 2, padding 1; H: dilation 2; W: kernel 1.
    cases.extend(with_gradients(
        ["conv3d", "conv3d_bwd_in", "conv3d_bwd_w"],
        geometry(&[2, 1, 1], &[1, 0, 0], &[1, 2, 1], 2),
        [&[2, 4, 7, 6, 5], &[6, 2, 3, 2, 1], &[2, 6, 4, 4, 5]],
    ));
    let up = geometry(&[2, 2, 2], &[1, 1, 1], &[1, 1, 1], 1);
    cases.extend([
        // [1, 4, 3, 4, 5] -> [1, 3, 6, 8, 10]: k 4, stride 2, padding 1 doubles each axis.
        (
            "conv_transpose3d",
            Op::ConvTranspose {
                conv: up,
                output: vec![6, 8, 10],
            },
            vec![f(&[1, 4, 3, 4, 5]), f(&[4, 3, 4, 4, 4])],
        ),
        // Grouped, with an output padding of 1 along W: [2, 4, 5, 5] -> [2, 6, 9, 10].
        (
            "conv_transpose2d",
            Op::ConvTranspose {
                conv: geometry(&[2, 2], &[1, 1], &[1, 1], 2),
                output: vec![9, 10],
            },
            vec![f(&[2, 4, 5, 5]), f(&[4, 3, 3, 3])],
        ),
        (
            "batch_norm_ncdhw",
            Op::norm(NormKind::Batch, 1e-5),
            vec![f(&[2, 3, 4, 5, 6]), f(&[3]), f(&[3])],
        ),
        (
            "group_norm_ncdhw",
            Op::norm(NormKind::Group(2), 1e-5),
            vec![f(&[2, 4, 3, 5, 6]), f(&[4]), f(&[4])],
        ),
        (
            "group_norm_ncdhw_bwd_in",
            Op::NormBackwardInput {
                kind: NormKind::Group(2),
                eps: 1e-5,
            },
            vec![f(&[2, 4, 3, 5, 6]), f(&[4]), f(&[2, 4, 3, 5, 6])],
        ),
    ]);
    cases
}
