//! Finite-difference gradient checks of every differentiable op through the whole pipeline:
//! each case is a tiny model whose loss is `sum(op(...) * w)`; autodiff gradients (read just
//! before the update, with SGD at lr = 0 so parameters never move) are compared with central
//! differences of the loss on sampled entries of every parameter.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use common::{compiled, executor};
use memc::plan::BufferId;
use std::collections::HashMap;

const SAMPLES: usize = 12;

fn model(dims: &str, params: &str, body: &str, out: &str) -> String {
    format!(
        "model check {{\n  dim {dims}\n{params}\n  param w: {out} = normal(1.0)\n  let y = {body}\n  loss = sum(y * w)\n  train {{ optimizer = sgd(lr = 0.0) }}\n}}\n"
    )
}

/// The worst parameter's relative error ||g - fd|| / ||fd|| over its sampled entries (each
/// parameter judged on its own, so a wrong small gradient cannot hide behind a large one;
/// a parameter whose differences are below 1e-6 of the largest one's is judged against that
/// floor).
fn check(src: &str, eps: f32) -> f64 {
    check_with(src, eps, &[])
}

/// [`check`] with the integer inputs named in `ids` bound to their values.
fn check_with(src: &str, eps: f32, ids: &[(&str, &[i32])]) -> f64 {
    let c = compiled(src);
    let mut ex = executor(&c, 7);
    for (name, values) in ids {
        let input = ex.plan().inputs.iter().find(|i| i.name == *name);
        let buffer = input.unwrap_or_else(|| panic!("no input {name}")).buffer;
        ex.bind_ids(buffer, values).expect("ids");
    }
    let mut grads: HashMap<String, Vec<f32>> = HashMap::new();
    ex.run_step(Some(&mut |name: &str, g: &[f32]| {
        grads.insert(name.to_string(), g.to_vec());
    }))
    .expect("step");
    let params: Vec<(String, BufferId)> = ex
        .plan()
        .params
        .iter()
        .filter(|p| !p.running_statistic)
        .map(|p| (p.name.clone(), p.buffer))
        .collect();
    let mut sums: Vec<(f64, f64)> = Vec::new();
    for (name, buffer) in params {
        let (mut num, mut den) = (0.0f64, 0.0f64);
        let base = ex.read(buffer).to_vec();
        let g = grads
            .get(&name)
            .unwrap_or_else(|| panic!("no gradient for {name}"));
        let stride = (base.len() / SAMPLES).max(1);
        for j in (0..base.len()).step_by(stride).take(SAMPLES) {
            let mut eval = |delta: f32| {
                let mut p = base.clone();
                p[j] += delta;
                ex.write(buffer, &p).expect("write");
                ex.set_step_number(1);
                common::loss(&mut ex) as f64
            };
            let fd = (eval(eps) - eval(-eps)) / (2.0 * eps as f64);
            ex.write(buffer, &base).expect("restore");
            num += (g[j] as f64 - fd).powi(2);
            den += fd.powi(2);
        }
        sums.push((num, den));
    }
    let floor = 1e-12 * sums.iter().map(|s| s.1).fold(0.0, f64::max) + 1e-30;
    sums.iter()
        .map(|(num, den)| (num / den.max(floor)).sqrt())
        .fold(0.0, f64::max)
}

macro_rules! gradcheck {
    ($($name:ident: ($dims:expr, $params:expr, $body:expr, $out:expr, $eps:expr, $tol:expr);)*) => {
        $(
            #[test]
            fn $name() {
                let src = model($dims, $params, $body, $out);
                let err = check(&src, $eps);
                assert!(err < $tol, "{}: relative error {err:.2e} >= {}\n{src}", stringify!($name), $tol);
            }
        )*
    };
}

const X: &str = "  param x: [A, B] = normal(1.0)";
const XY: &str = "  param x: [A, B] = normal(1.0)\n  param z: [B] = uniform(0.5, 1.5)";

gradcheck! {
    add_broadcast: ("A = 3, B = 4", XY, "x + z", "[A, B]", 1e-2, 1e-2);
    sub_broadcast: ("A = 3, B = 4", XY, "z - x", "[A, B]", 1e-2, 1e-2);
    mul_broadcast: ("A = 3, B = 4", XY, "x * z", "[A, B]", 1e-2, 1e-2);
    div_broadcast: ("A = 3, B = 4", XY, "x / z", "[A, B]", 1e-2, 1e-2);
    affine: ("A = 3, B = 4", X, "2.0 - x * 3 + 1", "[A, B]", 1e-2, 1e-2);
    neg: ("A = 3, B = 4", X, "-x", "[A, B]", 1e-2, 1e-2);
    exp: ("A = 3, B = 4", X, "exp(x)", "[A, B]", 1e-2, 1e-2);
    log: ("A = 3, B = 4", "  param x: [A, B] = uniform(0.5, 2.0)", "log(x)", "[A, B]", 1e-3, 1e-2);
    sqrt: ("A = 3, B = 4", "  param x: [A, B] = uniform(0.5, 2.0)", "sqrt(x)", "[A, B]", 1e-3, 1e-2);
    rsqrt: ("A = 3, B = 4", "  param x: [A, B] = uniform(0.5, 2.0)", "rsqrt(x)", "[A, B]", 1e-3, 1e-2);
    tanh: ("A = 3, B = 4", X, "tanh(x)", "[A, B]", 1e-2, 1e-2);
    sigmoid: ("A = 3, B = 4", X, "sigmoid(x)", "[A, B]", 1e-2, 1e-2);
    relu: ("A = 3, B = 4", X, "relu(x)", "[A, B]", 1e-3, 1e-2);
    // Computed inputs whose outputs the product keeps: derivatives taken from the output.
    relu_from_output: ("A = 3, B = 4", X, "relu(x * 2.0)", "[A, B]", 1e-3, 1e-2);
    tanh_from_output: ("A = 3, B = 4", X, "tanh(x * 0.5)", "[A, B]", 1e-2, 1e-2);
    sigmoid_from_output: ("A = 3, B = 4", X, "sigmoid(x * 0.5)", "[A, B]", 1e-2, 1e-2);
    exp_from_output: ("A = 3, B = 4", X, "exp(x * 0.5)", "[A, B]", 1e-2, 1e-2);
    gelu_tanh: ("A = 3, B = 4", X, "gelu(x)", "[A, B]", 1e-2, 1e-2);
    gelu_exact: ("A = 3, B = 4", X, "gelu(x, exact = true)", "[A, B]", 1e-2, 1e-2);
    silu: ("A = 3, B = 4", X, "silu(x)", "[A, B]", 1e-2, 1e-2);
    erf: ("A = 3, B = 4", X, "erf(x)", "[A, B]", 1e-2, 1e-2);
    softplus: ("A = 3, B = 4", X, "softplus(x)", "[A, B]", 1e-2, 1e-2);
    sum_axis: ("A = 3, B = 4", X, "sum(x, axis = 0)", "[B]", 1e-2, 1e-2);
    mean_keepdim: ("A = 3, B = 4", X, "mean(x, axis = -1, keepdim = true)", "[A, 1]", 1e-2, 1e-2);
    max_axis: ("A = 3, B = 4", X, "max(x, axis = 1)", "[A]", 1e-3, 1e-2);
    softmax: ("A = 3, B = 5", X, "softmax(x, axis = 0)", "[A, B]", 1e-2, 1e-2);
    log_softmax: ("A = 3, B = 5", X, "log_softmax(x)", "[A, B]", 1e-2, 1e-2);
    layernorm: ("A = 3, B = 6", "  param x: [A, B] = normal(1.0)\n  param n: layernorm(B)", "layernorm(x, n)", "[A, B]", 1e-2, 2e-2);
    rmsnorm: ("A = 3, B = 6", "  param x: [A, B] = normal(1.0)\n  param n: rmsnorm(B)", "rmsnorm(x, n)", "[A, B]", 1e-2, 2e-2);
    batchnorm: ("N = 3, C = 2, H = 3", "  param x: [N, C, H, H] = normal(1.0)\n  param n: batchnorm(C)", "batchnorm(x, n)", "[N, C, H, H]", 1e-2, 2e-2);
    groupnorm: ("N = 2, C = 4, H = 3", "  param x: [N, C, H, H] = normal(1.0)\n  param n: groupnorm(2, C)", "groupnorm(x, n)", "[N, C, H, H]", 1e-2, 2e-2);
    matmul_batched: ("A = 2, B = 3, K = 4, M = 5", "  param x: [A, B, K] = normal(1.0)\n  param m: [K, M] = normal(1.0)", "x @ m", "[A, B, M]", 1e-2, 1e-2);
    matmul_broadcast_batch: ("A = 2, B = 3, K = 4", "  param x: [A, 1, B, K] = normal(1.0)\n  param m: [3, K, B] = normal(1.0)", "x @ m", "[A, 3, B, B]", 1e-2, 1e-2);
    linear_bias_epilogue: ("A = 3, K = 4, M = 5", "  param x: [A, K] = normal(1.0)\n  param l: linear(K, M)", "linear(x, l)", "[A, M]", 1e-2, 1e-2);
    matmul_transposed: ("A = 3, K = 4", "  param x: [A, K] = normal(1.0)\n  param m: [A, K] = normal(1.0)", "x @ transpose(m)", "[A, A]", 1e-2, 1e-2);
    // A reshape of a computed value is a view of its bytes.
    reshape_view: ("A = 2, B = 6", X, "reshape(tanh(x * 2.0), (A, 2, 3)) * 1.5", "[A, 2, 3]", 1e-2, 1e-2);
    reshape_permute: ("A = 2, B = 6", X, "permute(reshape(x, (A, 2, 3)), (2, 0, 1))", "[3, A, 2]", 1e-2, 1e-2);
    concat_split: ("A = 2, B = 6", X, "concat(slice(x, 2, 4), x, axis = 1)", "[A, 8]", 1e-2, 1e-2);
    slice: ("A = 2, B = 6", X, "slice(x, 1, 4)", "[A, 3]", 1e-2, 1e-2);
    conv2d: ("N = 2, C = 4, H = 6", "  param x: [N, C, H, H] = normal(1.0)\n  param c: conv2d(C, 6, 3, groups = 2, bias = true)", "conv2d(x, c, stride = 2, padding = 1, dilation = 1)", "[N, 6, 3, 3]", 1e-2, 1e-2);
    max_pool2d: ("N = 1, C = 2, H = 5", "  param x: [N, C, H, H] = uniform(-3.0, 3.0)", "max_pool2d(x, 3, stride = 2, padding = 1)", "[N, C, 3, 3]", 1e-3, 1e-2);
    avg_pool2d: ("N = 1, C = 2, H = 5", "  param x: [N, C, H, H] = normal(1.0)", "avg_pool2d(x, 3, stride = 2, padding = 1)", "[N, C, 3, 3]", 1e-2, 1e-2);
    // Padding wider than half the kernel: written out, then pooled without padding.
    max_pool2d_wide_padding: ("N = 1, C = 2, H = 4", "  param x: [N, C, H, H] = uniform(-3.0, 3.0)", "max_pool2d(x, 3, stride = 1, padding = 2)", "[N, C, 6, 6]", 1e-3, 1e-2);
    avg_pool2d_wide_padding: ("N = 1, C = 2, H = 4", "  param x: [N, C, H, H] = normal(1.0)", "avg_pool2d(x, 3, stride = 2, padding = (2, 2, 1, 2), count_pad = false)", "[N, C, 3, 3]", 1e-2, 1e-2);
    lrn: ("N = 1, C = 6, H = 3", "  param x: [N, C, H, H] = normal(1.0)", "lrn(x, size = 3, alpha = 0.5, beta = 0.75, bias = 1)", "[N, C, H, H]", 1e-2, 1e-2);
    lrn_even_window: ("N = 1, C = 5, H = 2", "  param x: [N, C, H, H] = normal(1.0)", "lrn(x, size = 4, alpha = 0.3, beta = 0.5, bias = 2)", "[N, C, H, H]", 1e-2, 1e-2);
    max_pool2d_asymmetric: ("N = 1, C = 2, H = 5", "  param x: [N, C, H, H] = uniform(-3.0, 3.0)", "max_pool2d(x, 3, stride = 2, padding = (0, 0, 1, 1))", "[N, C, 2, 2]", 1e-3, 1e-2);
    avg_pool2d_pad_not_counted: ("N = 1, C = 2, H = 5", "  param x: [N, C, H, H] = normal(1.0)", "avg_pool2d(x, 3, stride = 2, padding = (1, 0, 1, 1), count_pad = false)", "[N, C, 3, 2]", 1e-2, 1e-2);
    pad: ("N = 1, C = 2, H = 3", "  param x: [N, C, H, H] = normal(1.0)", "pad(x, (1, 0, 2, 1), value = 0.5)", "[N, C, 6, 4]", 1e-2, 1e-2);
    // The tensor form: a computed weight, whose gradient flows on to `k`.
    conv2d_tensor_weight: ("N = 2, C = 4, H = 5", "  param x: [N, C, H, H] = normal(1.0)\n  param k: [6, 2, 3, 3] = normal(1.0)", "conv2d(x, tanh(k), groups = 2, padding = 1)", "[N, 6, H, H]", 1e-2, 1e-2);
    conv2d_asymmetric: ("N = 1, C = 2, H = 6", "  param x: [N, C, H, H] = normal(1.0)\n  param c: conv2d(C, 2, (2, 3))", "conv2d(x, c, padding = (0, 1, 1, 0))", "[N, 2, 6, 5]", 1e-2, 1e-2);
    global_avg_pool: ("N = 2, C = 3, H = 4", "  param x: [N, C, H, H] = normal(1.0)", "global_avg_pool(x)", "[N, C]", 1e-2, 1e-2);
    upsample: ("N = 1, C = 2, H = 3", "  param x: [N, C, H, H] = normal(1.0)", "upsample(x, 2)", "[N, C, 6, 6]", 1e-2, 1e-2);
    // NCL and NCDHW: convolutions (grouped, strided, padded, dilated, each axis its own),
    // transposed convolutions, 3-D pooling, upsampling and norms over volumes.
    conv1d: ("N = 2, C = 4, L = 9", "  param x: [N, C, L] = normal(1.0)\n  param c: conv1d(C, 6, 3, groups = 2, bias = true)", "conv1d(x, c, stride = 2, padding = 2, dilation = 2)", "[N, 6, 5]", 1e-2, 1e-2);
    conv3d: ("N = 2, C = 4, S = 5", "  param x: [N, C, S, S, 4] = normal(1.0)\n  param c: conv3d(C, 6, (3, 2, 1), groups = 2, bias = true)", "conv3d(x, c, stride = (2, 1, 1), padding = (1, 0, 0), dilation = (1, 2, 1))", "[N, 6, 3, 3, 4]", 1e-2, 1e-2);
    conv_transpose2d: ("N = 2, C = 4, H = 3", "  param x: [N, C, H, H] = normal(1.0)\n  param c: conv_transpose2d(C, 6, 3, groups = 2, bias = true)", "conv_transpose2d(x, c, stride = 2, padding = 1, output_padding = 1)", "[N, 6, 6, 6]", 1e-2, 1e-2);
    conv_transpose3d: ("N = 1, C = 3, S = 2", "  param x: [N, C, S, S, 3] = normal(1.0)\n  param c: conv_transpose3d(C, 2, (2, 2, 3), bias = true)", "conv_transpose3d(x, c, stride = 2, padding = (0, 0, 1), dilation = (1, 2, 1))", "[N, 2, 4, 5, 5]", 1e-2, 1e-2);
    max_pool3d: ("N = 1, C = 2, S = 5", "  param x: [N, C, S, 4, S] = uniform(-3.0, 3.0)", "max_pool3d(x, (3, 2, 3), stride = (2, 2, 1), padding = (1, 0, 1))", "[N, C, 3, 2, 5]", 1e-3, 1e-2);
    avg_pool3d: ("N = 1, C = 2, S = 4", "  param x: [N, C, S, S, S] = normal(1.0)", "avg_pool3d(x, 2)", "[N, C, 2, 2, 2]", 1e-2, 1e-2);
    avg_pool3d_pad_not_counted: ("N = 1, C = 2, S = 5", "  param x: [N, C, S, S, 3] = normal(1.0)", "avg_pool3d(x, 3, stride = 2, padding = 1, count_pad = false)", "[N, C, 3, 3, 2]", 1e-2, 1e-2);
    upsample3d: ("N = 1, C = 2, S = 2", "  param x: [N, C, S, 3, S] = normal(1.0)", "upsample(x, 2)", "[N, C, 4, 6, 4]", 1e-2, 1e-2);
    global_avg_pool3d: ("N = 2, C = 3, S = 3", "  param x: [N, C, S, 2, S] = normal(1.0)", "global_avg_pool(x)", "[N, C]", 1e-2, 1e-2);
    batchnorm3d: ("N = 2, C = 2, S = 3", "  param x: [N, C, S, S, 2] = normal(1.0)\n  param n: batchnorm(C)", "batchnorm(x, n)", "[N, C, S, S, 2]", 1e-2, 2e-2);
    groupnorm3d: ("N = 2, C = 4, S = 3", "  param x: [N, C, S, 2, S] = normal(1.0)\n  param n: groupnorm(2, C)", "groupnorm(x, n)", "[N, C, S, 2, S]", 1e-2, 2e-2);
    attention_causal_gqa: ("B = 2, T = 5, D = 8", "  param q: [B, T, D] = normal(1.0)\n  param k: [B, T, 4] = normal(1.0)\n  param v: [B, T, 4] = normal(1.0)", "attention(q, k, v, heads = 4, kv_heads = 2, causal = true)", "[B, T, D]", 1e-2, 1e-2);
    attention_window_gqa: ("B = 2, T = 7, D = 8", "  param q: [B, T, D] = normal(1.0)\n  param k: [B, T, 4] = normal(1.0)\n  param v: [B, T, 4] = normal(1.0)", "attention(q, k, v, heads = 4, kv_heads = 2, causal = true, window = 3)", "[B, T, D]", 1e-2, 1e-2);
    attention_softcap_window_gqa: ("B = 2, T = 7, D = 8", "  param q: [B, T, D] = normal(1.0)\n  param k: [B, T, 4] = normal(1.0)\n  param v: [B, T, 4] = normal(1.0)", "attention(q, k, v, heads = 4, kv_heads = 2, causal = true, window = 3, softcap = 0.5)", "[B, T, D]", 1e-2, 1e-2);
    rope: ("B = 2, T = 5, D = 8", "  param x: [B, T, D] = normal(1.0)", "rope(x, heads = 2)", "[B, T, D]", 1e-2, 1e-2);
    dropout: ("A = 4, B = 8", X, "dropout(x, p = 0.3)", "[A, B]", 1e-2, 1e-2);
    embedding_tied: ("V = 7, D = 4, N = 6", "  param t: [V, D] = normal(1.0)\n  input ids: i32[N]", "embed(t, ids) @ transpose(t)", "[N, V]", 1e-2, 1e-2);
    mse: ("A = 3, B = 4", XY, "mse(x, z * x) + x * 0", "[A, B]", 1e-2, 1e-2);
    reciprocal: ("A = 3, B = 4", "  param x: [A, B] = uniform(0.5, 2.0)", "reciprocal(x)", "[A, B]", 1e-3, 1e-2);
    minimum_broadcast: ("A = 3, B = 4", XY, "minimum(x, z)", "[A, B]", 1e-3, 1e-2);
    maximum_broadcast: ("A = 3, B = 4", XY, "maximum(z, x)", "[A, B]", 1e-3, 1e-2);
    maximum_number: ("A = 3, B = 4", X, "maximum(x, 0.25)", "[A, B]", 1e-3, 1e-2);
    // Both operands of pow get a gradient: a positive base, a broadcast exponent.
    pow_broadcast: ("A = 3, B = 4", "  param x: [A, B] = uniform(0.5, 2.0)\n  param z: [B] = uniform(-1.5, 2.5)", "pow(x, z)", "[A, B]", 1e-3, 1e-2);
    pow_number: ("A = 3, B = 4", "  param x: [A, B] = uniform(0.5, 2.0)", "pow(x, 1.5) + pow(2.0, x)", "[A, B]", 1e-3, 1e-2);
    // A mask has no gradient; the product's gradient flows through `x` alone.
    comparison_mask: ("A = 3, B = 4", XY, "less(x, z) * x + greater_equal(z, x) * z", "[A, B]", 1e-3, 1e-2);
    where_broadcast: ("A = 3, B = 4", XY, "where(greater(x, 0.0), x * 2.0, z)", "[A, B]", 1e-3, 1e-2);
    where_number: ("A = 3, B = 4", XY, "where(less_equal(z, 1.0), 0.5, x) + z", "[A, B]", 1e-3, 1e-2);
    clamp_numbers: ("A = 3, B = 4", X, "clamp(x, -0.5, 0.75)", "[A, B]", 1e-3, 1e-2);
    clamp_upper: ("A = 3, B = 4", X, "clamp(x, hi = 0.3)", "[A, B]", 1e-3, 1e-2);
    clamp_tensors: ("A = 3, B = 4", XY, "clamp(x, z - 1.5, z)", "[A, B]", 1e-3, 1e-2);
    clamp_tensor_and_number: ("A = 3, B = 4", XY, "clamp(x, lo = z - 1.2, hi = 0.9)", "[A, B]", 1e-3, 1e-2);
}

/// Every gradient of a model's parameters after one step of `src` (SGD at lr = 0).
fn gradients(src: &str) -> HashMap<String, Vec<f32>> {
    let c = compiled(src);
    let mut ex = executor(&c, 7);
    let mut grads: HashMap<String, Vec<f32>> = HashMap::new();
    ex.run_step(Some(&mut |name: &str, g: &[f32]| {
        grads.insert(name.to_string(), g.to_vec());
    }))
    .expect("step");
    grads
}

/// Gradients where finite differences are undefined, as PyTorch defines them: operands
/// that tie in `minimum`/`maximum` get half of the gradient each; `clamp` passes the whole
/// gradient to `x` at a bound (numbers or tensors), and a tensor bound gets none there.
#[test]
fn ties_split_or_pass_the_gradient_as_pytorch_does() {
    let tie = |body: &str| {
        let src = format!(
            "model ties {{
  dim A = 2, B = 3
  param a: [A, B] = ones()
  param b: [A, B] = ones()
  let y = {body}
  loss = sum(y * 3.0)
  train {{ optimizer = sgd(lr = 0.0) }}
}}
"
        );
        let g = gradients(&src);
        let (Some(ga), Some(gb)) = (g.get("a"), g.get("b")) else {
            panic!("{body}: gradients missing: {:?}", g.keys());
        };
        (ga[0], gb[0])
    };
    assert_eq!(tie("maximum(a, b)"), (1.5, 1.5));
    assert_eq!(tie("minimum(a, b)"), (1.5, 1.5));
    assert_eq!(tie("clamp(a, lo = b) + b * 0.0"), (3.0, 0.0));
    assert_eq!(tie("clamp(a, hi = b) + b * 0.0"), (3.0, 0.0));
    assert_eq!(tie("clamp(a, 1.0, 2.0) + b * 0.0"), (3.0, 0.0));
    assert_eq!(tie("clamp(a, 0.0, 1.0) + b * 0.0"), (3.0, 0.0));
    // Crossed bounds: `hi` wins, and takes the gradient.
    assert_eq!(tie("clamp(a, lo = b + 1.0, hi = b) + b * 0.0"), (0.0, 3.0));
}

#[test]
fn cross_entropy() {
    let src = "model ce {\n  dim N = 6, C = 5\n  param x: [N, C] = normal(1.0)\n  input t: i32[N]\n  loss = cross_entropy(x * 2, t)\n  train { optimizer = sgd(lr = 0.0) }\n}\n";
    let err = check(src, 1e-2);
    assert!(err < 1e-2, "relative error {err:.2e}");
}

/// Rows of the ignored id take no loss and no gradient and the mean is over the others: -100
/// (never a class) and 3 (a class, which the kept rows' softmax still covers).
#[test]
fn cross_entropy_ignore_index() {
    for (k, t) in [(-100, [0, -100, 4, -100, 2, 1]), (3, [3, 0, 3, 1, 4, 3])] {
        let src = format!("model ce {{\n  dim N = 6, C = 5\n  param x: [N, C] = normal(1.0)\n  input t: i32[N]\n  loss = cross_entropy(x * 2, t, ignore_index = {k})\n  train {{ optimizer = sgd(lr = 0.0) }}\n}}\n");
        let err = check_with(&src, 1e-2, &[("t", &t)]);
        assert!(err < 1e-2, "ignore_index = {k}: relative error {err:.2e}");
    }
}

/// The fused loss head (`cross_entropy(x @ w, t)` becomes `linear_cross_entropy`) in both
/// weight layouts, with a tied table read twice, over chunks that do not divide the rows
/// (6 rows, default chunk 4 in fp32), every row kept and with ignored rows.
#[test]
fn linear_cross_entropy() {
    let heads = [
        (
            "  param x: [N, D] = normal(1.0)\n  param w: [D, V] = normal(0.5)",
            "x @ w",
        ),
        (
            "  param x: [2, 3, D] = normal(1.0)\n  param e: [V, D] = normal(0.5)",
            "x @ transpose(e)",
        ),
        (
            "  param e: [V, D] = normal(1.0)\n  input ids: i32[N]",
            "embed(e, ids) @ transpose(e)",
        ),
    ];
    // Every head also with rows 1 and 4 ignored.
    let ignoring = [
        (", ignore_index = -100", &[0, -100, 4, 2, -100, 1][..]),
        ("", &[]),
    ];
    for ((params, logits), (ignore, t)) in heads.into_iter().flat_map(|h| ignoring.map(|i| (h, i)))
    {
        let targets = if logits.starts_with("x @ transpose") {
            "[2, 3]"
        } else {
            "[N]"
        };
        let src = format!(
            "model lce {{\n  dim N = 6, D = 4, V = 5\n{params}\n  input t: i32{targets}\n  loss = cross_entropy({logits}, t{ignore})\n  train {{ optimizer = sgd(lr = 0.0) }}\n}}\n"
        );
        let graph = common::compiled(&src).graph;
        let fused = graph
            .values()
            .any(|v| matches!(graph.node(v).op, memc::ir::Op::LinearCrossEntropy(_)));
        assert!(fused, "{logits}: the loss head was not fused");
        let ids: &[(&str, &[i32])] = if t.is_empty() { &[] } else { &[("t", t)] };
        let err = check_with(&src, 1e-2, ids);
        assert!(err < 1e-2, "{logits}{ignore}: relative error {err:.2e}");
    }
}

/// Attention with a key mask, plain, causal and windowed, grouped-query: padding at the end of
/// item 0 and at the start of item 1 (whose first queries, under a causal mask, see only
/// padding), and an item all padding (zeros out, zero gradients).
#[test]
fn attention_key_mask() {
    let padded: &[i32] = &[1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 1];
    let item_padding: &[i32] = &[1, 0, 1, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0];
    let cases = [
        ("", padded),
        (", causal = true", padded),
        (", causal = true, window = 3", padded),
        ("", item_padding),
        (", causal = true", item_padding),
    ];
    for (mask, m) in cases {
        let src = format!("model attn {{\n  dim B = 2, T = 7, D = 8\n  param q: [B, T, D] = normal(1.0)\n  param k: [B, T, 4] = normal(1.0)\n  param v: [B, T, 4] = normal(1.0)\n  input pad: i32[B, T]\n  param w: [B, T, D] = normal(1.0)\n  let y = attention(q, k, v, heads = 4, kv_heads = 2{mask}, key_mask = pad)\n  loss = sum(y * w)\n  train {{ optimizer = sgd(lr = 0.0) }}\n}}\n");
        let err = check_with(&src, 1e-2, &[("pad", m)]);
        assert!(err < 1e-2, "{mask} {m:?}: relative error {err:.2e}");
    }
}

/// Arithmetic on a bf16 and an fp32 operand is fp32, the bf16 one widened exactly as it is
/// read (PyTorch's promotion): the fp32 parameter's gradient is the fp32 formula's; the
/// bf16 one's is each op's part rounded to bf16 and summed in bf16, as PyTorch's autograd
/// sums a bf16 leaf's gradient (within two bf16 roundings of the formula).
#[test]
fn promoted_arithmetic_takes_each_operand_in_its_own_type() {
    let src = "model mixed {\n  dim A = 2, B = 3\n  param a: bf16[A, B] = normal(1.0)\n  param b: [B] = uniform(1.5, 2.5)\n  let y = a * b + b - a / b\n  loss = sum(y * 3.0)\n  train { optimizer = sgd(lr = 0.0) }\n}\n";
    let c = compiled(src);
    let mut ex = executor(&c, 7);
    let value = |ex: &memc::exec::cpu::CpuExecutor, name: &str| {
        let p = ex.plan().params.iter().find(|p| p.name == name);
        ex.read(p.unwrap_or_else(|| panic!("no {name}")).buffer)
            .to_vec()
    };
    let (a, b) = (value(&ex, "a"), value(&ex, "b"));
    let mut grads: HashMap<String, Vec<f32>> = HashMap::new();
    ex.run_step(Some(&mut |name: &str, g: &[f32]| {
        grads.insert(name.to_string(), g.to_vec());
    }))
    .expect("step");
    for (i, &got) in grads["a"].iter().enumerate() {
        let bj = b[i % 3];
        let want = 3.0 * bj - 3.0 / bj;
        assert!(
            (got - want).abs() <= 2.0 / 128.0 * want.abs(),
            "a[{i}]: {got} != {want}"
        );
        assert_eq!(got, half::bf16::from_f32(got).to_f32(), "a[{i}] is bf16");
    }
    for (j, &bj) in b.iter().enumerate() {
        let want: f32 = (0..2)
            .map(|i| 3.0 * a[3 * i + j] + 3.0 + 3.0 * a[3 * i + j] / (bj * bj))
            .sum();
        let got = grads["b"][j];
        assert!(
            (got - want).abs() <= 1e-5 * want.abs(),
            "b[{j}]: {got} != {want}"
        );
    }
}

/// Attention over q, k and v sliced from one parameter, which the packed-attention pass reads
/// as one operand: causal and not, grouped-query with a window, and with a key mask (item 0
/// padded at its end, item 1 at its start); each plan holds the packed forward and backward
/// and no slice or concat.
#[test]
fn packed_attention() {
    let pad: &[i32] = &[1, 1, 1, 0, 0, 0, 1, 1, 1, 1];
    let cases = [
        ("W = 24, K = 16", "heads = 2, causal = true"),
        ("W = 24, K = 16", "heads = 2"),
        (
            "W = 16, K = 12",
            "heads = 4, kv_heads = 2, causal = true, window = 3",
        ),
        (
            "W = 16, K = 12",
            "heads = 4, kv_heads = 2, causal = true, key_mask = pad",
        ),
    ];
    for (dims, options) in cases {
        let masked = options.contains("key_mask");
        let params = if masked {
            "  param x: [B, T, W] = normal(1.0)\n  input pad: i32[B, T]"
        } else {
            "  param x: [B, T, W] = normal(1.0)"
        };
        let src = model(
            &format!("B = 2, T = 5, D = 8, {dims}"),
            params,
            &format!("attention(slice(x, 0, D), slice(x, D, K), slice(x, K, W), {options})"),
            "[B, T, D]",
        );
        let c = compiled(&src);
        let ops: Vec<&str> = c.plan.plan().steps.iter().map(|s| s.op.name()).collect();
        for (op, n) in [
            ("packed_attention", 1),
            ("packed_attention_backward", 1),
            ("slice", 0),
            ("concat", 0),
        ] {
            let found = ops.iter().filter(|&&o| o == op).count();
            assert_eq!(found, n, "{options}: {op} in {ops:?}");
        }
        let ids: &[(&str, &[i32])] = if masked { &[("pad", pad)] } else { &[] };
        let err = check_with(&src, 1e-2, ids);
        assert!(err < 1e-2, "{options}: relative error {err:.2e}");
    }
}
