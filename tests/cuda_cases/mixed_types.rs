//! Cases whose inputs' types differ from their output's: arithmetic on a 16-bit and an
//! fp32 operand (type promotion, as the residual adds of a mixed-precision step read their
//! 16-bit branch: the result is fp32, each operand read in its own type, either one the
//! narrow one, broadcast or not), cast groups (fp32 parameters cast to 16 bits into one
//! packed output through the tensor table), norm input gradients that add a residual
//! gradient of another type as they store (`passes::norm_accumulate`), and merged norm
//! gradients summing the input gradient rounded to a narrower type, storing a copy of it in
//! that type or reading a narrower `dy`, and residual adds with the norm of their sum.

use super::{output, t, KernelCase};
use memc::codegen::kernel_for;
use memc::ir::{BinaryFn, DType, NormKind, Op, TensorType};

/// The case `label` of `op` over `inputs` (`dtype` names its narrow type), checked against
/// the CPU backend running the same op on the inputs widened to f32.
fn case(label: String, dtype: DType, op: Op, inputs: Vec<TensorType>) -> KernelCase {
    let output = output(&op, &inputs);
    let kernel = kernel_for(&op, &inputs, &output)
        .unwrap_or_else(|e| panic!("{label}: {e}"))
        .unwrap_or_else(|| panic!("{label}: no kernel"));
    KernelCase {
        label,
        dtype,
        f32_op: op.clone(),
        op,
        f32_inputs: inputs.iter().map(|x| x.with_dtype(DType::F32)).collect(),
        inputs,
        output,
        kernel,
    }
}

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
            let mut inputs = vec![t(DType::F32, &[4, 33]), t(DType::F32, &[4, 33])];
            inputs[which] = inputs[which].with_dtype(narrow);
            if fun == BinaryFn::Mul {
                inputs[1 - which] = t(DType::F32, &[33]);
            }
            let case = case(format!("{label}/{narrow}"), narrow, op.clone(), inputs);
            assert_eq!(case.output.dtype, DType::F32, "{label}: promoted to fp32");
            out.push(case);
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
            out.push(case(label, to, op, inputs));
        }
    }
    out
}

/// Layer and RMS norm input gradients over fp32 rows that add a residual gradient in f32,
/// f16 or bf16 (with a bf16 `dy` beside the bf16 one, as a mixed-precision step has).
pub fn accumulated_norm_cases() -> Vec<KernelCase> {
    let mut out = Vec::new();
    for (kind, name, eps) in [
        (NormKind::Layer, "layer", 1e-5),
        (NormKind::Rms, "rms", 1e-6),
    ] {
        for residual in [DType::F32, DType::F16, DType::BF16] {
            let dy = if residual == DType::BF16 {
                DType::BF16
            } else {
                DType::F32
            };
            let rows = t(DType::F32, &[6, 72]);
            let inputs = vec![
                rows.clone(),
                t(DType::F32, &[72]),
                t(dy, &[6, 72]),
                t(residual, &[6, 72]),
            ];
            let op = Op::NormBackwardInput { kind, eps };
            let label = format!("{name}_norm_bwd_in_accumulated/{residual}");
            out.push(case(label, residual, op, inputs));
        }
    }
    out
}

/// A norm's merged gradients over fp32 rows for each of `types`, labelled `what`: `dy` in
/// `dy_of` the type, the input gradient summed rounded to and copied in the types
/// `rounded_of` it gives; a layer norm with its bias gradient, 300 rows of 128 in chunks of
/// 2 rows; an RMS norm adding an fp32 residual gradient, 7 rows of 384.
fn merged_norm_cases(
    what: &str,
    types: &[DType],
    dy_of: impl Fn(DType) -> DType,
    rounded_of: impl Fn(DType) -> (Option<DType>, Option<DType>),
) -> Vec<KernelCase> {
    let mut out = Vec::new();
    for &narrow in types {
        for (name, kind, bias, rows, ch) in [
            ("layer", NormKind::Layer, true, 300, 128),
            ("rms", NormKind::Rms, false, 7, 384),
        ] {
            let mut inputs = vec![t(DType::F32, &[rows, ch]), t(DType::F32, &[ch])];
            inputs.push(t(dy_of(narrow), &[rows, ch]));
            if kind == NormKind::Rms {
                inputs.push(t(DType::F32, &[rows, ch]));
            }
            let (sum, copy) = rounded_of(narrow);
            let op = Op::NormBackward {
                kind,
                eps: 1e-5,
                bias,
                sum,
                copy,
            };
            let label = format!("{name}_norm_bwd_{what}/{narrow}");
            out.push(case(label, narrow, op, inputs));
        }
    }
    out
}

/// Merged norm gradients summing the input gradient rounded to f16 or bf16, as the
/// mixed-precision step's linear bias gradients read it, or as it is, as an fp32 step's do.
pub fn summed_norm_cases() -> Vec<KernelCase> {
    let types = [DType::F16, DType::BF16, DType::F32];
    merged_norm_cases("summed", &types, |_| DType::F32, |t| (Some(t), None))
}

/// Merged norm gradients that also store their fp32 input gradient rounded to f16 or bf16
/// (the cast the matmuls below read), summed in that type or not.
pub fn copied_norm_cases() -> Vec<KernelCase> {
    let types = [DType::F16, DType::BF16];
    let mut out = merged_norm_cases("copied", &types, |_| DType::F32, |t| (Some(t), Some(t)));
    out.extend(merged_norm_cases(
        "copied_unsummed",
        &types,
        |_| DType::F32,
        |t| (None, Some(t)),
    ));
    out
}

/// Merged norm gradients whose `dy` is f16 or bf16, read as it is (`passes::promote`: the
/// loss head's or an MLP's 16-bit input gradient).
pub fn narrow_dy_norm_cases() -> Vec<KernelCase> {
    merged_norm_cases(
        "narrow_dy",
        &[DType::F16, DType::BF16],
        |t| t,
        |_| (None, None),
    )
}

/// A residual add and the norm of its sum in one op, one operand f16 or bf16 and the other
/// fp32 (the sum in fp32): a layer norm over 300 rows of 128 and over 2 rows of 16,384 (in
/// slices), its output in the narrow type, and an RMS norm over 7 rows of 384 storing fp32.
pub fn add_norm_cases() -> Vec<KernelCase> {
    let mut out = Vec::new();
    for narrow in [DType::F16, DType::BF16] {
        for (name, kind, rows, ch, store) in [
            ("layer", NormKind::Layer, 300, 128, Some(narrow)),
            ("layer_sliced", NormKind::Layer, 2, 16384, Some(narrow)),
            ("rms", NormKind::Rms, 7, 384, None),
        ] {
            let (a, b) = match kind {
                NormKind::Rms => (narrow, DType::F32),
                _ => (DType::F32, narrow),
            };
            let mut inputs = vec![t(a, &[rows, ch]), t(b, &[rows, ch]), t(DType::F32, &[ch])];
            if kind == NormKind::Layer {
                inputs.push(t(DType::F32, &[ch]));
            }
            let op = Op::AddNorm {
                kind,
                eps: 1e-5,
                store,
            };
            out.push(case(
                format!("{name}_add_norm/{narrow}"),
                narrow,
                op,
                inputs,
            ));
        }
    }
    out
}
