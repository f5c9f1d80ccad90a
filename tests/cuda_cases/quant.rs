//! Dequantize cases: both schemes, both output-channel axes for int8, nf4 over two groups
//! of block absmaxes and a short last block, into every compute precision.

use super::t;
use memc::codegen::{kernel_for, Kernel};
use memc::ir::*;

/// One dequantize case: its label, op, packed input type, output type and kernel.
pub struct QuantCase {
    pub label: String,
    pub quant: Quantized,
    pub op: Op,
    pub input: TensorType,
    pub output: TensorType,
    pub kernel: Kernel,
}

/// Every dequantize case (small shapes: the shim runs each thread as a fiber).
pub fn quant_cases() -> Vec<QuantCase> {
    let weights = [
        (Scheme::Int8, [5, 70], 0),
        (Scheme::Int8, [70, 5], 1),
        (Scheme::Nf4, [260, 66], 0),
    ];
    let mut out = Vec::new();
    for (scheme, shape, out_axis) in weights {
        for to in [DType::F32, DType::F16, DType::BF16] {
            let quant = Quantized {
                scheme,
                shape,
                out_axis,
            };
            let op = Op::Dequantize { quant, to };
            let input = t(DType::U8, &[quant.packed_bytes() as usize]);
            let output = t(to, &shape);
            let label = format!(
                "dequantize_{scheme}_{}x{}_axis{out_axis}/{to}",
                shape[0], shape[1]
            );
            let kernel = kernel_for(&op, std::slice::from_ref(&input), &output)
                .unwrap_or_else(|e| panic!("{label}: {e}"))
                .unwrap_or_else(|| panic!("{label}: no kernel"));
            out.push(QuantCase {
                label,
                quant,
                op,
                input,
                output,
                kernel,
            });
        }
    }
    out
}
