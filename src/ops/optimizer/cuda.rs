//! CUDA lowering of the optimizer ops onto `optim.cu`: AdamW and SGD updating in place, the
//! global-norm clip coefficient, the fused unscale-and-overflow check, the loss-scale update
//! and gradient accumulation.

use crate::codegen::build::{c_bool, c_f32, c_u64, Gen};
use crate::codegen::launch::{in_names, single, Launch};
use crate::codegen::ops::Args;
use crate::codegen::{ctype, CodegenError, Kernel, KernelParam};
use crate::ir::Op;
use crate::ops::cuda::CudaLowering;
use KernelParam::{Input as In, MicroStep, Output as Out, Step};

/// `optim.cu`: the optimizer, clipping and loss-scaling templates.
const TEMPLATE: &str = include_str!("optim.cu");

/// An optimizer step updating `p` in place from `g` and `states` state tensors, with the
/// clip coefficient as an optional last input; `hyper` are its constants after `N`.
fn optimizer(
    a: &Args,
    family: &'static str,
    states: usize,
    hyper: Vec<String>,
    types: [&str; 3],
) -> Result<Kernel, CodegenError> {
    let n = a.at(0)?.numel();
    let n_in = 2 + states;
    let clip = a.inputs.len() == n_in + 1;
    let mut lines = vec![c_u64("N", n)];
    lines.extend(hyper);
    lines.push(c_bool("HAS_CLIP", clip));
    let mut args = in_names(n_in);
    args.push(if clip {
        format!("in{n_in}")
    } else {
        "0ull".to_string()
    });
    let call = format!(
        "{family}_kernel<{}, Cfg>(arena, {}, step)",
        types.join(", "),
        args.join(", ")
    );
    let mut params: Vec<KernelParam> = (0..n_in + usize::from(clip)).map(In).collect();
    params.push(Step);
    Ok(single(
        family,
        &[TEMPLATE],
        lines,
        call,
        &params,
        Launch::Elementwise(n),
    ))
}

/// A single-block kernel that accumulates `accum<T, CfgI>(arena, inI, acc)` over the inputs
/// in `range` (each becomes a parameter); the caller adds the finishing call.
fn multi_tensor_reduce(
    a: &Args,
    family: &'static str,
    accum: &str,
    range: std::ops::Range<usize>,
) -> Gen {
    let mut k = Gen::new(family, &[TEMPLATE]);
    k.call("double acc = 0.0".to_string());
    for i in range {
        k.cfg(&format!("Cfg{i}"), vec![c_u64("N", a.inputs[i].numel())]);
        k.call(format!(
            "{accum}<{}, Cfg{i}>(arena, in{i}, acc)",
            ctype(a.inputs[i].dtype)
        ));
        k.params(&[In(i)]);
    }
    k.launch([1, 1, 1], 1024);
    k
}

/// The clip coefficient over the gradients (the loss scale, when `scaled`, is the last input).
fn clip_coefficient(a: &Args, max_norm: f32, scaled: bool) -> Kernel {
    let grads = a.inputs.len() - usize::from(scaled);
    let mut k = multi_tensor_reduce(a, "clip_coefficient", "clip_accum", 0..grads);
    k.cfg(
        "Cfg",
        vec![c_f32("MAX_NORM", max_norm), c_bool("SCALED", scaled)],
    );
    let mul = if scaled {
        k.params(&[In(grads)]);
        format!("in{grads}")
    } else {
        "0ull".to_string()
    };
    k.call(format!("clip_finish<Cfg>(arena, {mul}, out, acc)"));
    k.params(&[Out]);
    k.finish()
}

impl CudaLowering for super::Family {
    /// No kernel of this family reads a workspace.
    fn cuda_workspace_bytes(
        &self,
        _: &crate::ir::Op,
        _: &[&crate::ir::TensorType],
        _: &crate::ir::TensorType,
    ) -> u64 {
        0
    }

    fn lower(&self, a: &Args) -> Result<Kernel, CodegenError> {
        match a.op {
            Op::ClipCoefficient { max_norm, scaled } => Ok(clip_coefficient(a, *max_norm, *scaled)),
            Op::UnscaleGrads => {
                let mut k =
                    multi_tensor_reduce(a, "unscale_grads", "unscale_accum", 1..a.inputs.len());
                k.params(&[In(0), Out]);
                k.call("unscale_finish(arena, in0, out, acc)".to_string());
                Ok(k.finish())
            }
            Op::LossScaleUpdate { growth_interval } => Ok(single(
                "loss_scale_update",
                &[TEMPLATE],
                vec![c_u64("GROWTH", u64::from(*growth_interval))],
                "loss_scale_update_kernel<Cfg>(arena, in0, in1, in2)".to_string(),
                &[In(0), In(1), In(2)],
                Launch::Grid([1, 1, 1], 32),
            )),
            Op::AccumulateGrad { micro_steps } => {
                let g = a.at(1)?;
                Ok(single(
                    "accumulate_grad",
                    &[TEMPLATE],
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
            Op::AdamW(h) => {
                let tm = a.ty(2)?;
                let hyper = vec![
                    c_f32("LR", h.lr),
                    c_f32("B1", h.beta1),
                    c_f32("B2", h.beta2),
                    c_f32("EPS", h.eps),
                    c_f32("WD", h.weight_decay),
                ];
                optimizer(a, "adamw", 2, hyper, [a.ty(0)?, a.ty(1)?, tm])
            }
            Op::Sgd(h) => {
                let hyper = vec![
                    c_f32("LR", h.lr),
                    c_f32("MOMENTUM", h.momentum),
                    c_f32("WD", h.weight_decay),
                ];
                optimizer(a, "sgd", 1, hyper, [a.ty(0)?, a.ty(1)?, a.ty(2)?])
            }
            _ => Err(a.foreign("optimizer")),
        }
    }
}
