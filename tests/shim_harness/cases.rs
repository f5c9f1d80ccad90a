//! The op cases' check through the shim: each case's kernel compiled with g++, run in
//! either order of blocks and threads, and compared with the CPU backend within the
//! tolerances `tests/shim.rs` states.

use super::*;
use crate::cuda_cases::KernelCase;
use memc::ir::{AttnInput, DType, Op, TensorType};
use memc::plan::Target;
use std::collections::HashMap;
use std::path::Path;

/// The scratch bytes the case's kernel takes on CUDA.
pub fn workspace(case: &KernelCase) -> u64 {
    let refs: Vec<&TensorType> = case.inputs.iter().collect();
    Target::CUDA_MIN.workspace_bytes(&case.op, &refs, &case.output)
}

/// Compiles, runs and compares one case; returns (max error, max error ratio).
fn run_case(case: &KernelCase, dir: &Path) -> Result<(f32, f32), String> {
    let exe = compile(&case.kernel, dir)?;
    let data = case_data(&case.op, &case.inputs, 7);
    let want = match rounds_intermediates_to_operands(&case.op) {
        true => cpu_reference(&case.op, &case.inputs, &data, CASE_STEP),
        false => cpu_reference(&case.f32_op, &case.f32_inputs, &data, CASE_STEP),
    };
    let arena = dir.join(format!("{}.arena", case.kernel.name));
    let run = |reverse| {
        shim_run(
            &exe,
            &case.kernel,
            (&case.inputs, &case.output),
            &data,
            case.op.mutated_inputs(),
            &arena,
            reverse,
            workspace(case),
        )
    };
    let got = run(false)?;
    if run(true)?.bits() != got.bits() {
        return Err("the result depends on the order of threads or blocks (a race)".to_string());
    }
    let slack = intermediate_rounding_slack(&case.op, &case.inputs);
    compare_results((&got, &want), &case.op, &case.output, &case.inputs)
        .map(|(err, ratio)| (err, ratio / slack))
}

/// Whether `op`'s definition rounds an intermediate to its operands' type, so that its
/// reference is the CPU backend's op in that type rather than in f32: the fused loss head,
/// whose logits are rounded as its GEMM writes them.
fn rounds_intermediates_to_operands(op: &Op) -> bool {
    matches!(
        op,
        Op::LinearCrossEntropy(_) | Op::LinearCrossEntropyBackward { .. }
    )
}

/// How many times the format's tolerance a case may differ by because its kernel rounds an
/// fp32 intermediate to the 16-bit operand type before a product: attention's probabilities
/// and score gradients, the A operand of the next MMA or GEMM (as FlashAttention-2 does).
/// Those rounding errors add up over the `n` keys (or query rows) a gradient sums, as
/// sqrt(n): sqrt(n / 16), at least 1. Every other case, and attention in f32: 1.
fn intermediate_rounding_slack(op: &Op, inputs: &[TensorType]) -> f32 {
    let Some(q) = inputs.first() else {
        return 1.0;
    };
    // A packed operand's rows are its queries and its keys.
    let k = inputs.get(1).unwrap_or(q);
    let summed = match op {
        Op::Attention(_)
        | Op::AttentionBackward {
            which: AttnInput::Q,
            ..
        } => k.shape[1],
        Op::AttentionBackward { attn, .. } => q.shape[1] * attn.heads / attn.kv_heads.max(1),
        // Packed: the keys (forward), or the most of the keys and a group's query rows.
        Op::PackedAttention(_) => q.shape[1],
        Op::PackedAttentionBackward(attn) => q.shape[1] * attn.heads / attn.kv_heads.max(1),
        _ => return 1.0,
    };
    if q.dtype == DType::F32 {
        return 1.0;
    }
    (summed as f32 / 16.0).sqrt().max(1.0)
}

/// Where `op`'s flat output holds elements of a narrower type than its own, and how many of
/// which type: a merged norm gradient's copy of its input gradient, or the norm of a
/// residual add's sum stored narrower than the sum.
fn narrow_part(op: &Op, inputs: &[TensorType]) -> Option<(usize, usize, DType)> {
    let x = inputs.first()?;
    match op {
        Op::NormBackward {
            bias,
            sum,
            copy: Some(t),
            ..
        } => {
            let ch = inputs[1].numel();
            let dims = (x.numel() / ch.max(1), ch, x.dtype.size());
            let at = memc::ops::norm::GradsLayout::new(dims, *bias, sum.is_some(), Some(t.size()));
            Some((at.copy as usize, x.numel() as usize, *t))
        }
        Op::AddNorm { store: Some(t), .. } if *t != DType::F32 => {
            let at = memc::ops::norm::add_norm_at(x.numel(), t.size()).0;
            Some((at as usize, x.numel() as usize, *t))
        }
        _ => None,
    }
}

/// `values` (a flat output's elements) up to `at`, and the `n` elements of type `t` its
/// bytes hold from there on, decoded.
fn split_narrow(values: &[f32], (at, n, t): (usize, usize, DType)) -> (Vec<f32>, Vec<f32>) {
    let bytes: Vec<u8> = values[at..].iter().flat_map(|v| v.to_le_bytes()).collect();
    let narrow = memc::exec::lowp::from_bytes(t, &bytes[..n * t.size() as usize]);
    (values[..at].to_vec(), narrow)
}

/// (max error, max error ratio) over a step's output and updated inputs; a part of the
/// output in a narrower type (`narrow_part`) is decoded and compared in that type.
pub fn compare_results(
    (got, want): (&Results, &Results),
    op: &Op,
    output: &TensorType,
    inputs: &[TensorType],
) -> Result<(f32, f32), String> {
    let mut pairs = Vec::new();
    if let (Some(g), Some(w)) = (&got.output, &want.output) {
        match narrow_part(op, inputs) {
            Some(part) if g.len() == w.len() => {
                let ((g, gn), (w, wn)) = (split_narrow(g, part), split_narrow(w, part));
                pairs.push((g, w, output.dtype));
                pairs.push((gn, wn, part.2));
            }
            _ => pairs.push((g.clone(), w.clone(), output.dtype)),
        }
    } else if got.output.is_some() != want.output.is_some() {
        return Err("output presence differs".to_string());
    }
    for ((i, g), (_, w)) in got.updated.iter().zip(&want.updated) {
        pairs.push((g.clone(), w.clone(), inputs[*i].dtype));
    }
    if pairs.is_empty() {
        return Err("nothing to compare".to_string());
    }
    Ok(pairs
        .into_iter()
        .map(|(g, w, dt)| compare(&g, &w, dt))
        .fold((0f32, 0f32), |a, b| (a.0.max(b.0), a.1.max(b.1))))
}

/// Runs every case through the shim, in either order of blocks and threads, against the CPU
/// backend; prints a summary per dtype and fails naming each case out of tolerance. Without
/// g++ prints SKIP.
pub fn check_kernel_cases(cases: &[KernelCase]) {
    if let Some(why) = gxx_missing() {
        println!("SKIP: {why}");
        return;
    }
    let start = std::time::Instant::now();
    let dir = tempfile::tempdir().expect("temp dir");
    let results = par_map(cases, |c| run_case(c, dir.path()));
    let mut failures = Vec::new();
    let mut summary: HashMap<DType, (usize, f32, f32)> = HashMap::new();
    for (case, r) in cases.iter().zip(&results) {
        match r {
            Ok((err, ratio)) if *ratio <= 1.0 => {
                let s = summary.entry(case.dtype).or_default();
                *s = (s.0 + 1, s.1.max(*err), s.2.max(*ratio));
            }
            Ok((err, ratio)) => failures.push(format!(
                "{}: max error {err:e} is {ratio:.1}x the tolerance",
                case.label
            )),
            Err(e) => failures.push(format!("{}: {e}", case.label)),
        }
    }
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let (n, err, ratio) = summary.get(&dtype).copied().unwrap_or_default();
        println!(
            "{dtype}: {n} kernels match the CPU backend (max abs error {err:e}, \
             {ratio:.3} of the tolerance)"
        );
    }
    println!("{} cases in {:.1?}", cases.len(), start.elapsed());
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
