//! Cases whose inputs' types differ from their output's: arithmetic on a 16-bit and an
//! fp32 operand (type promotion, as the residual adds of a mixed-precision step read their
//! 16-bit branch: the result is fp32, each operand read in its own type, either one the
//! narrow one, broadcast or not), and cast groups (fp32 parameters cast to 16 bits into
//! one packed output through the tensor table).

use super::{output, t, KernelCase};
use memc::codegen::kernel_for;
use memc::ir::{BinaryFn, DType, Op};

/// Add, sub, mul and div with one operand in f16 or bf16 and the other in f32.
pub fn promoted_cases() -> Vec<KernelCase> {
    let funs = [
        ("promoted_add", BinaryFn::Add, 1),
        ("promoted_sub", BinaryFn::Sub, 0),
        ("promoted_mul", BinaryFn::Mul, 1),
        ("promoted_div", BinaryFn::Div, 0),
    ];
    let mut out = Vec::new();
    for narrow in [DType::F16, DType::BF16] {
        for (label, fun, which) in funs {
            let op = Op::Binary(fun);
            let f32_inputs = vec![t(DType::F32, &[4, 33]), t(DType::F32, &[4, 33])];
            let mut inputs = f32_inputs.clone();
            inputs[which] = inputs[which].with_dtype(narrow);
            if fun == BinaryFn::Mul {
                inputs[1 - which] = t(DType::F32, &[33]);
            }
            let f32_inputs = inputs.iter().map(|x| x.with_dtype(DType::F32)).collect();
            let output = output(&op, &inputs);
            assert_eq!(output.dtype, DType::F32, "{label}: promoted to fp32");
            let kernel = kernel_for(&op, &inputs, &output)
                .unwrap_or_else(|e| panic!("{label}/{narrow}: {e}"))
                .unwrap_or_else(|| panic!("{label}/{narrow}: no kernel"));
            out.push(KernelCase {
                label: format!("{label}/{narrow}"),
                dtype: narrow,
                f32_op: op.clone(),
                op,
                f32_inputs,
                inputs,
                output,
                kernel,
            });
        }
    }
    out
}

/// Cast groups of fp32 tensors to f16 and bf16: one tensor, and several of sizes that are
/// not multiples of the block (the last one odd).
pub fn cast_group_cases() -> Vec<KernelCase> {
    let shapes: [&[&[usize]]; 2] = [&[&[4, 33]], &[&[64, 48], &[48], &[3, 5, 7], &[129]]];
    let mut out = Vec::new();
    for to in [DType::F16, DType::BF16] {
        for members in shapes {
            let inputs: Vec<_> = members.iter().map(|s| t(DType::F32, s)).collect();
            let op = Op::CastGroup {
                to,
                tensors: inputs.len() as u32,
            };
            let label = format!("cast_group_{}/{to}", inputs.len());
            let output = output(&op, &inputs);
            let kernel = kernel_for(&op, &inputs, &output)
                .unwrap_or_else(|e| panic!("{label}: {e}"))
                .unwrap_or_else(|| panic!("{label}: no kernel"));
            out.push(KernelCase {
                label,
                dtype: to,
                f32_op: op.clone(),
                op,
                f32_inputs: inputs.clone(),
                inputs,
                output,
                kernel,
            });
        }
    }
    out
}
