//! CUDA lowering of the optimizer ops onto `optim.cu`: AdamW (fp32 or 8-bit moments) and SGD
//! updating in place (bf16 parameters optionally rounded stochastically), the
//! global-norm clip coefficient, the fused unscale-and-overflow check, the loss-scale update
//! and gradient accumulation. The clip coefficient and the overflow check read their
//! gradients through a tensor table in their workspace (their arguments do not grow with the
//! model) and reduce them in two stages over up to [`PARTIAL_BLOCKS`] blocks; an AdamW group
//! reads its parameters, gradients and moments through such a table and steps them all in
//! one elementwise launch.

use super::quantize;
use super::{adamw_states, AdamWParams, Rounding, StateFormat};
use crate::codegen::build::{c_bool, c_f32, c_int, c_u64, Gen};
use crate::codegen::geometry::{split, PARTIAL_BLOCKS};
use crate::codegen::launch::{in_names, single, Launch};
use crate::codegen::ops::Args;
use crate::codegen::{ctype, CodegenError, Kernel, KernelParam, TensorTable};
use crate::ir::{Op, TensorType};
use crate::ops::cuda::CudaLowering;
use crate::ops::random::RNG_CU;
use KernelParam::{Input as In, MicroStep, Output as Out, Step, Stream};

/// The optimizer family's templates: `rng.cu` (the random bits of stochastic rounding) and
/// `optim.cu` (the optimizer, clipping and loss-scaling templates).
const TEMPLATE: [&str; 2] = [RNG_CU, include_str!("optim.cu")];

/// Threads of a block of the 8-bit AdamW kernel; each takes `BLOCK / THREADS` elements of
/// its quantization block.
const THREADS: u32 = 256;

/// An optimizer step updating `p` in place from `g` and `states` state tensors, with the
/// clip coefficient as an optional last input and the parameter stored with `rounding`;
/// `hyper` are its constants after `N`, `types` its template's type arguments. 8-bit AdamW
/// (`eight_bit`) runs one block per quantization block with the maps as `__device__` tables;
/// the others are elementwise.
fn optimizer(
    a: &Args,
    (family, states, eight_bit): (&'static str, usize, bool),
    mut hyper: Vec<String>,
    types: &[&str],
    rounding: Rounding,
) -> Result<Kernel, CodegenError> {
    let n = a.at(0)?.numel();
    let n_in = 2 + states;
    let clip = a.inputs.len() == n_in + 1;
    let mut lines = vec![c_u64("N", n)];
    lines.append(&mut hyper);
    lines.push(c_bool("HAS_CLIP", clip));
    let stochastic = match rounding {
        Rounding::Nearest => None,
        Rounding::Stochastic { key } => Some(key),
    };
    lines.push(c_bool("SR", stochastic.is_some()));
    lines.push(c_u64("SR_KEY", stochastic.unwrap_or(0)));
    let mut args = in_names(n_in);
    args.push(if clip {
        format!("in{n_in}")
    } else {
        "0ull".to_string()
    });
    args.push("step".to_string());
    args.push(
        if stochastic.is_some() {
            "stream"
        } else {
            "0ull"
        }
        .to_string(),
    );
    let mut params: Vec<KernelParam> = (0..n_in + usize::from(clip)).map(In).collect();
    params.push(Step);
    params.extend(stochastic.map(|_| Stream));
    let mut k = Gen::new(family, &TEMPLATE);
    if eight_bit {
        let blocks = quantize::blocks(n);
        lines.extend([
            c_u64("BLOCK", quantize::BLOCK),
            c_u64("BLOCKS", blocks),
            c_int("PER", (quantize::BLOCK / u64::from(THREADS)) as i64),
            "static __device__ __forceinline__ float qmap_signed(unsigned k) { return MEMC_QMAP_SIGNED[k]; }".to_string(),
            "static __device__ __forceinline__ float qmap_unsigned(unsigned k) { return MEMC_QMAP_UNSIGNED[k]; }".to_string(),
        ]);
        k.global(quantize::map_literal(
            "MEMC_QMAP_SIGNED",
            quantize::signed_map(),
        ));
        k.global(quantize::map_literal(
            "MEMC_QMAP_UNSIGNED",
            quantize::unsigned_map(),
        ));
        k.per_block(blocks, THREADS);
    } else {
        k.elementwise(n);
    }
    k.cfg("Cfg", lines);
    k.call(format!(
        "{family}_kernel<{}, Cfg>(arena, {})",
        types.join(", "),
        args.join(", ")
    ));
    k.params(&params);
    Ok(k.finish())
}

/// AdamW's hyper-parameters as kernel constants.
fn adamw_hyper(h: &AdamWParams) -> Vec<String> {
    vec![
        c_f32("LR", h.lr),
        c_f32("B1", h.beta1),
        c_f32("B2", h.beta2),
        c_f32("EPS", h.eps),
        c_f32("WD", h.weight_decay),
    ]
}

/// The table of an AdamW group: every input of its `quads` (parameter, gradient, moments)
/// in order.
fn group_table(inputs: &[&TensorType], quads: usize) -> TensorTable {
    TensorTable::new(
        inputs[..quads.min(inputs.len())]
            .iter()
            .enumerate()
            .map(|(i, t)| (i, t.numel(), t.dtype)),
    )
}

/// One launch stepping every parameter of an AdamW group (`adamw_group_kernel`): the group's
/// table in the workspace, the multiplier (if any) and the step number as arguments.
fn adamw_group(a: &Args, h: &AdamWParams, tensors: u32) -> Result<Kernel, CodegenError> {
    let quads = 4 * tensors as usize;
    let refs: Vec<&TensorType> = a.inputs.iter().collect();
    let total: u64 = refs.iter().take(quads).step_by(4).map(|t| t.numel()).sum();
    let clip = refs.len() > quads;
    let mut lines = vec![c_u64("TENSORS", u64::from(tensors)), c_u64("TOTAL", total)];
    lines.extend(adamw_hyper(h));
    lines.extend([
        c_bool("HAS_CLIP", clip),
        c_bool("SR", false),
        c_u64("SR_KEY", 0),
    ]);
    let mut k = Gen::new("adamw_group", &TEMPLATE);
    k.cfg("Cfg", lines);
    k.params(&[KernelParam::Workspace]);
    let clip_arg = if clip {
        k.params(&[In(quads)]);
        format!("in{quads}")
    } else {
        "0ull".to_string()
    };
    k.params(&[Step]);
    k.call(format!(
        "adamw_group_kernel<{}, {}, {}, Cfg>(arena, ws, {clip_arg}, step)",
        a.ty(0)?,
        a.ty(1)?,
        a.ty(2)?
    ));
    k.elementwise(total);
    k.table(group_table(&refs, quads));
    Ok(k.finish())
}

/// Elements a block of the gradient reductions takes at least: 16 per thread of a
/// 256-thread block.
const MIN_CHUNK: u64 = 16 * 256;

/// The gradients a reduction reads through its tensor table: every input but the scalar at
/// `scalar` (the loss scale or the multiplier), if any.
fn grads<'a>(
    inputs: &'a [&TensorType],
    scalar: Option<usize>,
) -> impl Iterator<Item = (usize, &'a TensorType)> {
    inputs
        .iter()
        .copied()
        .enumerate()
        .filter(move |(i, _)| Some(*i) != scalar)
}

/// (table, elements, blocks, chunk) of a reduction over the gradients.
fn split_grads(inputs: &[&TensorType], scalar: Option<usize>) -> (TensorTable, u64, u64, u64) {
    let table = TensorTable::new(grads(inputs, scalar).map(|(i, t)| (i, t.numel(), t.dtype)));
    let total: u64 = grads(inputs, scalar).map(|(_, t)| t.numel()).sum();
    let (blocks, chunk) = split(total, MIN_CHUNK, PARTIAL_BLOCKS);
    (table, total, blocks, chunk)
}

/// Where the op's scalar input sits among its inputs: the loss scale first for the overflow
/// check, the multiplier last for a scaled clip coefficient.
fn scalar_input(op: &Op, n_inputs: usize) -> Option<usize> {
    match op {
        Op::UnscaleGrads => Some(0),
        Op::ClipCoefficient { scaled: true, .. } => n_inputs.checked_sub(1),
        _ => None,
    }
}

/// A two-stage reduction over the gradients (`template` is the clip coefficient's or the
/// overflow check's): the table and the partials in the workspace, the scalar input (or 0)
/// and the output as arguments; `lines` are its constants besides the geometry.
fn gradient_reduction(
    a: &Args,
    family: &'static str,
    template: &str,
    mut lines: Vec<String>,
) -> Kernel {
    let refs: Vec<&TensorType> = a.inputs.iter().collect();
    let scalar = scalar_input(a.op, refs.len());
    let (table, total, blocks, chunk) = split_grads(&refs, scalar);
    lines.extend([
        c_u64("TENSORS", grads(&refs, scalar).count() as u64),
        c_u64("TOTAL", total),
        c_u64("CHUNK", chunk),
        c_u64("PARTS", blocks),
        c_u64("TABLE_BYTES", table.len_bytes()),
    ]);
    let mut k = Gen::new(family, &TEMPLATE);
    k.cfg("Cfg", lines);
    let scalar_arg = match scalar {
        Some(i) => {
            k.params(&[In(i)]);
            format!("in{i}")
        }
        None => "0ull".to_string(),
    };
    k.params(&[Out, KernelParam::Workspace, KernelParam::Phase]);
    k.call(format!(
        "{template}<Cfg>(arena, {scalar_arg}, out, ws, phase)"
    ));
    k.launch([blocks, 1, 1], 256);
    k.finish_over(1);
    k.table(table);
    k.finish()
}

impl CudaLowering for super::Family {
    /// The clip coefficient and the overflow check keep their gradients' tensor table
    /// (24 bytes a gradient) and then one fp64 partial per block of their first launch (8
    /// bytes each) there; no other kernel of the family takes a workspace.
    fn cuda_workspace_bytes(&self, op: &Op, inputs: &[&TensorType], _: &TensorType) -> u64 {
        match op {
            Op::ClipCoefficient { .. } | Op::UnscaleGrads => {
                let (table, _, blocks, _) = split_grads(inputs, scalar_input(op, inputs.len()));
                table.len_bytes() + blocks * 8
            }
            Op::AdamWGroup { tensors, .. } => {
                group_table(inputs, 4 * *tensors as usize).len_bytes()
            }
            _ => 0,
        }
    }

    fn lower(&self, a: &Args) -> Result<Kernel, CodegenError> {
        match a.op {
            Op::ClipCoefficient { max_norm, scaled } => Ok(gradient_reduction(
                a,
                "clip_coefficient",
                "clip_coefficient_kernel",
                vec![c_f32("MAX_NORM", *max_norm), c_bool("SCALED", *scaled)],
            )),
            Op::UnscaleGrads => Ok(gradient_reduction(
                a,
                "unscale_grads",
                "unscale_grads_kernel",
                Vec::new(),
            )),
            Op::LossScaleUpdate { growth_interval } => Ok(single(
                "loss_scale_update",
                &TEMPLATE,
                vec![c_u64("GROWTH", u64::from(*growth_interval))],
                "loss_scale_update_kernel<Cfg>(arena, in0, in1, in2)".to_string(),
                &[In(0), In(1), In(2)],
                Launch::Grid([1, 1, 1], 32),
            )),
            Op::AccumulateGrad { micro_steps } => {
                let g = a.at(1)?;
                Ok(single(
                    "accumulate_grad",
                    &TEMPLATE,
                    vec![
                        c_u64("N", g.numel()),
                        c_f32("SCALE", 1.0 / *micro_steps as f32),
                    ],
                    format!(
                        "accumulate_grad_kernel<{}, Cfg>(arena, in0, in1, micro)",
                        ctype(g.dtype)
                    ),
                    &[In(0), In(1), MicroStep],
                    Launch::Elementwise(g.numel()),
                ))
            }
            Op::AdamWGroup { hyper, tensors } => adamw_group(a, hyper, *tensors),
            Op::AdamW(h) => {
                let hyper = adamw_hyper(h);
                let states = adamw_states(h.state);
                match h.state {
                    StateFormat::Fp32 => {
                        let types = [a.ty(0)?, a.ty(1)?, a.ty(2)?];
                        optimizer(a, ("adamw", states, false), hyper, &types, h.rounding)
                    }
                    StateFormat::Int8 => {
                        let types = [a.ty(0)?, a.ty(1)?];
                        optimizer(a, ("adamw8", states, true), hyper, &types, h.rounding)
                    }
                }
            }
            Op::Sgd(h) => {
                let hyper = vec![
                    c_f32("LR", h.lr),
                    c_f32("MOMENTUM", h.momentum),
                    c_f32("WD", h.weight_decay),
                ];
                let types = [a.ty(0)?, a.ty(1)?, a.ty(2)?];
                optimizer(a, ("sgd", 1, false), hyper, &types, h.rounding)
            }
            _ => Err(a.foreign("optimizer")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::DType;

    /// The clip coefficient over `n` gradients of 1,000 elements (the multiplier last).
    fn clip(n: usize) -> (Kernel, u64) {
        let mut inputs = vec![TensorType::new(DType::F32, vec![1000]); n];
        inputs.push(TensorType::new(DType::F32, vec![]));
        let op = Op::ClipCoefficient {
            max_norm: 1.0,
            scaled: true,
        };
        let out = TensorType::new(DType::F32, vec![]);
        let kernel = crate::codegen::kernel_for(&op, &inputs, &out)
            .ok()
            .flatten()
            .expect("the clip coefficient has a kernel");
        let refs: Vec<&TensorType> = inputs.iter().collect();
        let ws = crate::plan::Target::CUDA_MIN.workspace_bytes(&op, &refs, &out);
        (kernel, ws)
    }

    #[test]
    fn gradient_reductions_take_the_same_arguments_for_any_number_of_tensors() {
        let (few, few_ws) = clip(3);
        let (many, many_ws) = clip(800);
        // Arena, multiplier (the last input), output, workspace, phase.
        for (k, n) in [(&few, 3), (&many, 800)] {
            let want = [
                KernelParam::Arena,
                In(n),
                Out,
                KernelParam::Workspace,
                KernelParam::Phase,
            ];
            assert_eq!(k.params, want);
        }
        // 3,000 elements: one block; 800,000: ceil(800,000 / 4,096) = 196 blocks.
        assert_eq!(few.grid, [1, 1, 1]);
        assert_eq!(many.grid, [196, 1, 1]);
        assert_eq!(few_ws, 3 * 24 + 8);
        assert_eq!(many_ws, 800 * 24 + 196 * 8);
        let table = many.table.expect("a tensor table");
        assert_eq!(table.len_bytes(), 800 * 24);
        let bytes = table.bytes(|i| 256 * i as u64);
        // Row 2: offset 512, first element 2,000, type f32 (0).
        let row: Vec<u64> = bytes[48..72]
            .chunks(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect();
        assert_eq!(row, [512, 2000, 0]);
    }
}
