//! Appends the optimizer as graph ops: for each parameter with a gradient, its persistent
//! state (AdamW: two fp32 moments, or two u8 code tensors and two f32 absmax tensors with
//! `state = int8`; SGD with momentum: one buffer) and an in-place update node, which rounds
//! a bf16 parameter stochastically under `stochastic_rounding`, keyed by the parameter's
//! position; with global-norm clipping, one clip coefficient computed from all gradients. With a
//! loss scale (fp16), one fused check unscales the gradients and flags overflow, every update
//! is skipped on overflow, and the scale is updated as `torch.amp.GradScaler` does. With
//! gradient accumulation, each gradient is added to a persistent fp32 accumulator as soon as
//! it is complete (a backward-phase step), and everything above reads the accumulators.
//! With `offload`, each update runs on host copies (`copy_to_host`) of its parameter,
//! gradient and multiplier, its state is read only by it (so the plan places it in the
//! host arena), and `copy_to_device` writes the updated parameter back. With data
//! parallelism every gradient is first made the ranks' mean (`passes::partition`), and under
//! ZeRO-1 and 2 each update writes this rank's shard, gathered back into the parameter; with
//! mixed precision a 16-bit parameter's update writes this rank's fp32 master shard instead,
//! gathered into the parameter rounded.

use super::autodiff::Differentiated;
use super::{partition, StageError};
use crate::ir::*;
use crate::ops::optimizer::quantize::{blocks, signed_map, unsigned_map, zero_code};
use crate::ops::optimizer::{Rounding, StateFormat};
use crate::parallel::Parallel;
use crate::settings::Optimizer;

/// Training settings the optimizer pass needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OptimizerOptions {
    pub optimizer: Optimizer,
    pub clip_grad_norm: Option<f32>,
    /// The persistent loss scale the differentiated objective was multiplied by.
    pub loss_scale: Option<ValueId>,
    /// Micro-batches per step (1: no accumulation).
    pub accumulate: u32,
    /// Round bf16 parameters stochastically after their update (pure bf16 only).
    pub stochastic_rounding: bool,
    /// Keep the state in host memory and update on the host (`--offload optimizer`): each
    /// update reads host copies of its parameter, gradient and multiplier, and a copy
    /// writes the updated parameter back to the device.
    pub offload: bool,
    /// Where `clip_grad_norm` was set: the clip coefficient's source span (none: no span).
    pub clip_span: Option<Span>,
    /// Data parallelism: gradients become the ranks' mean before anything reads them, and
    /// under ZeRO-1 and 2 each update writes this rank's shard, gathered into the parameter
    /// (`passes::partition`).
    pub parallel: Option<crate::parallel::Parallel>,
    /// Under ZeRO-1 and 2 with mixed precision: a 16-bit trained parameter is the whole
    /// 16-bit copy of fp32 master weights that this rank keeps a shard of as optimizer
    /// state (`passes::partition::keep_16bit_copies`).
    pub masters: bool,
}

/// `torch.amp.GradScaler`'s default growth interval: clean steps before the scale doubles.
pub const GROWTH_INTERVAL: u32 = 2000;

fn internal(e: TypeError) -> StageError {
    StageError::internal("optimizer", e.message)
}

fn not_a_parameter(param: ValueId) -> StageError {
    StageError::internal("optimizer", format!("{param} is not a parameter"))
}

/// Replaces each gradient of `pairs` by a persistent fp32 accumulator that a backward-phase
/// step adds the gradient into as soon as it is complete.
fn accumulators(
    graph: &mut Graph,
    pairs: &mut [(ValueId, ValueId)],
    micro_steps: u32,
) -> Result<(), StageError> {
    for (param, grad) in pairs {
        let node = graph.node(*param);
        let (Op::Param { name, ty, .. }, span) = (&node.op, node.span) else {
            return Err(not_a_parameter(*param));
        };
        let at = Origin {
            span,
            scope: node.scope.clone(),
            phase: Phase::Backward,
        };
        let acc = Op::OptimState {
            name: format!("{name}.grad_acc"),
            ty: ty.with_dtype(DType::F32),
            init: 0.0,
        };
        let acc = graph.add(acc, vec![], &at).map_err(internal)?;
        let op = Op::AccumulateGrad { micro_steps };
        graph.add(op, vec![acc, *grad], &at).map_err(internal)?;
        *grad = acc;
    }
    Ok(())
}

/// Adds the optimizer state of `param` and its in-place update from `grad`, scaled by
/// `multiplier` (the clip coefficient or the loss-scale unscale) when there is one, storing
/// the parameter with `rounding` if it is bf16 (to nearest otherwise).
fn update(
    graph: &mut Graph,
    (param, grad): (ValueId, ValueId),
    (optimizer, rounding): (Optimizer, Rounding),
    multiplier: Option<ValueId>,
    (offload, parallel, masters): (bool, Option<Parallel>, bool),
    origin: &mut Origin,
) -> Result<(), StageError> {
    let (name, mut rounding) = match &graph.node(param).op {
        Op::Param { name, .. } => (name.clone(), rounding),
        _ => return Err(not_a_parameter(param)),
    };
    origin.span = graph.node(param).span;
    origin.scope = graph.node(param).scope.clone();
    let origin = &*origin;
    let host = |graph: &mut Graph, v: ValueId| {
        graph.add(Op::CopyToHost, vec![v], origin).map_err(internal)
    };
    let sharded = match parallel {
        Some(parallel) if !offload => {
            partition::update_target(graph, (param, grad), (parallel, masters), origin)?
        }
        _ => None,
    };
    let (target, grad) = if offload {
        let grad = host(graph, grad)?;
        (host(graph, param)?, grad)
    } else {
        sharded.unwrap_or((param, grad))
    };
    let ty = graph.node(target).ty.with_dtype(DType::F32);
    // Only a bf16 parameter (no fp32 masters) is rounded stochastically.
    if graph.node(target).ty.dtype != DType::BF16 {
        rounding = Rounding::Nearest;
    }
    let state = |graph: &mut Graph, suffix: &str, ty: &TensorType, init: u8| {
        graph
            .add(
                Op::OptimState {
                    name: format!("{name}.{suffix}"),
                    ty: ty.clone(),
                    init: f32::from(init),
                },
                vec![],
                origin,
            )
            .map_err(internal)
    };
    let (op, mut inputs) = match optimizer {
        Optimizer::AdamW(mut p) => {
            p.rounding = rounding;
            let mut inputs = vec![target, grad];
            match p.state {
                StateFormat::Fp32 => {
                    inputs.push(state(graph, "exp_avg", &ty, 0)?);
                    inputs.push(state(graph, "exp_avg_sq", &ty, 0)?);
                }
                StateFormat::Int8 => {
                    let codes = ty.with_dtype(DType::U8);
                    let absmax = TensorType::new(DType::F32, vec![blocks(ty.numel()) as usize]);
                    let (signed, unsigned) = (zero_code(signed_map()), zero_code(unsigned_map()));
                    inputs.push(state(graph, "exp_avg", &codes, signed)?);
                    inputs.push(state(graph, "exp_avg_sq", &codes, unsigned)?);
                    inputs.push(state(graph, "exp_avg.absmax", &absmax, 0)?);
                    inputs.push(state(graph, "exp_avg_sq.absmax", &absmax, 0)?);
                }
            }
            (Op::AdamW(p), inputs)
        }
        Optimizer::Sgd(mut p) => {
            p.rounding = rounding;
            let b = state(graph, "momentum_buffer", &ty, 0)?;
            (Op::Sgd(p), vec![target, grad, b])
        }
    };
    inputs.extend(multiplier);
    graph.add(op, inputs, origin).map_err(internal)?;
    if let (Some(parallel), Some(_)) = (parallel, sharded) {
        partition::gather_update(graph, (param, target), parallel, origin)?;
    }
    if offload {
        let back = vec![param, target];
        graph
            .add(Op::CopyToDevice, back, origin)
            .map_err(internal)?;
    }
    Ok(())
}

/// Adds the loss-scale update (its clean-step counter and the GradScaler rule) reading the
/// overflow flag of `unscale`.
fn loss_scale_update(
    graph: &mut Graph,
    scale: ValueId,
    unscale: ValueId,
    origin: &mut Origin,
) -> Result<(), StageError> {
    origin.span = graph.node(scale).span;
    origin.scope = String::new();
    let clean = graph
        .add(
            Op::OptimState {
                name: "loss_scale.clean_steps".into(),
                ty: TensorType::new(DType::F32, vec![]),
                init: 0.0,
            },
            vec![],
            origin,
        )
        .map_err(internal)?;
    graph
        .add(
            Op::LossScaleUpdate {
                growth_interval: GROWTH_INTERVAL,
            },
            vec![scale, clean, unscale],
            origin,
        )
        .map_err(internal)?;
    Ok(())
}

/// Adds state and update nodes; returns the new graph (gradients keep their ids).
pub fn run(diff: &Differentiated, options: &OptimizerOptions) -> Result<Graph, StageError> {
    let mut graph = diff.graph.clone();
    let mut origin = Origin {
        span: Span::default(),
        scope: String::new(),
        phase: Phase::Update,
    };
    let mut pairs = diff.grads.clone();
    if options.accumulate > 1 {
        accumulators(&mut graph, &mut pairs, options.accumulate)?;
    }
    if let Some(parallel) = options.parallel {
        for (param, grad) in &mut pairs {
            let at = Origin {
                span: graph.node(*param).span,
                scope: graph.node(*param).scope.clone(),
                phase: Phase::Update,
            };
            *grad = partition::reduce_gradients(&mut graph, *grad, parallel, &at)?;
        }
    }
    let grads: Vec<ValueId> = pairs.iter().map(|&(_, g)| g).collect();
    let unscale = match options.loss_scale {
        Some(scale) if !grads.is_empty() => {
            let inputs = std::iter::once(scale)
                .chain(grads.iter().copied())
                .collect();
            Some(
                graph
                    .add(Op::UnscaleGrads, inputs, &origin)
                    .map_err(internal)?,
            )
        }
        _ => None,
    };
    let clip = match options.clip_grad_norm {
        Some(max_norm) if !grads.is_empty() => {
            let inputs = grads.iter().copied().chain(unscale).collect();
            let op = Op::ClipCoefficient {
                max_norm,
                scaled: unscale.is_some(),
            };
            let at = Origin {
                span: options.clip_span.unwrap_or(origin.span),
                ..origin.clone()
            };
            Some(graph.add(op, inputs, &at).map_err(internal)?)
        }
        _ => None,
    };
    let multiplier = match clip.or(unscale) {
        Some(m) if options.offload => Some(
            graph
                .add(Op::CopyToHost, vec![m], &origin)
                .map_err(internal)?,
        ),
        m => m,
    };
    for (k, &pair) in pairs.iter().enumerate() {
        let rounding = if options.stochastic_rounding {
            Rounding::Stochastic { key: k as u64 }
        } else {
            Rounding::Nearest
        };
        update(
            &mut graph,
            pair,
            (options.optimizer, rounding),
            multiplier,
            (options.offload, options.parallel, options.masters),
            &mut origin,
        )?;
    }
    if let (Some(scale), Some(unscale)) = (options.loss_scale, unscale) {
        loss_scale_update(&mut graph, scale, unscale, &mut origin)?;
    }
    Ok(graph)
}
