//! Update cases checked bit for bit against the CPU kernel: 8-bit AdamW and stochastic
//! rounding of bf16 parameters.

use super::{adamw, output, t, KernelCase};
use memc::codegen::kernel_for;
use memc::ir::*;
use memc::ops::optimizer::{Rounding, StateFormat};

/// [`adamw`] with block-wise 8-bit moments.
pub fn adamw8(weight_decay: f32) -> AdamWParams {
    AdamWParams {
        state: StateFormat::Int8,
        ..adamw(weight_decay)
    }
}

/// The inputs of an 8-bit AdamW update of `n` f32 parameters: param, grad, u8 codes of the
/// two moments, their f32 absmaxes (one per block of 2,048).
pub fn adamw8_inputs(n: usize) -> Vec<TensorType> {
    let blocks = n.div_ceil(2048);
    vec![
        t(DType::F32, &[n]),
        t(DType::F32, &[n]),
        t(DType::U8, &[n]),
        t(DType::U8, &[n]),
        t(DType::F32, &[blocks]),
        t(DType::F32, &[blocks]),
    ]
}

/// Update cases whose CUDA kernel must equal the CPU kernel bit for bit on the same
/// (bf16 or f32) inputs: 8-bit AdamW in f32 and bf16, and stochastic rounding of bf16
/// parameters by AdamW (fp32 and 8-bit moments) and SGD.
pub fn bitwise_kernel_cases() -> Vec<KernelCase> {
    use DType::{BF16, F32};
    let sr = Rounding::Stochastic { key: 5 };
    let n = 2048 + 900;
    let bf16_params = |mut inputs: Vec<TensorType>| {
        inputs[0] = inputs[0].with_dtype(BF16);
        inputs[1] = inputs[1].with_dtype(BF16);
        inputs
    };
    let mut clipped = adamw8_inputs(n);
    clipped.push(t(F32, &[]));
    let sgd = SgdParams {
        lr: 0.1,
        momentum: 0.9,
        weight_decay: 0.01,
        rounding: sr,
    };
    let plain = vec![t(F32, &[n]); 4];
    let cases = [
        ("adamw8", Op::AdamW(adamw8(0.01)), adamw8_inputs(n), F32),
        ("adamw8_clip", Op::AdamW(adamw8(0.01)), clipped, F32),
        (
            "adamw8",
            Op::AdamW(adamw8(0.01)),
            bf16_params(adamw8_inputs(n)),
            BF16,
        ),
        (
            "adamw8_sr",
            Op::AdamW(AdamWParams {
                rounding: sr,
                ..adamw8(0.01)
            }),
            bf16_params(adamw8_inputs(n)),
            BF16,
        ),
        (
            "adamw_sr",
            Op::AdamW(AdamWParams {
                rounding: sr,
                ..adamw(0.01)
            }),
            bf16_params(plain.clone()),
            BF16,
        ),
        (
            "sgd_sr",
            Op::Sgd(sgd),
            bf16_params(plain[..3].to_vec()),
            BF16,
        ),
    ];
    cases
        .into_iter()
        .map(|(label, op, inputs, dtype)| {
            let output = output(&op, &inputs);
            let kernel = kernel_for(&op, &inputs, &output)
                .unwrap_or_else(|e| panic!("{label}/{dtype}: {e}"))
                .unwrap_or_else(|| panic!("{label}/{dtype}: no kernel"));
            KernelCase {
                label: format!("{label}/{dtype}"),
                dtype,
                f32_op: op.clone(),
                op,
                f32_inputs: inputs.clone(),
                inputs,
                output,
                kernel,
            }
        })
        .collect()
}
