//! Appends the optimizer as graph ops: for each parameter with a gradient, its persistent
//! state (AdamW: two fp32 moments; SGD with momentum: one buffer) and an in-place update
//! node; with global-norm clipping, one clip coefficient computed from all gradients. With a
//! loss scale (fp16), one fused check unscales the gradients and flags overflow, every update
//! is skipped on overflow, and the scale is updated as `torch.amp.GradScaler` does. With
//! gradient accumulation, each gradient is added to a persistent fp32 accumulator as soon as
//! it is complete (a backward-phase step), and everything above reads the accumulators.

use super::autodiff::Differentiated;
use super::StageError;
use crate::front::train::Optimizer;
use crate::ir::*;

/// Training settings the optimizer pass needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OptimizerOptions {
    pub optimizer: Optimizer,
    pub clip_grad_norm: Option<f32>,
    /// The persistent loss scale the differentiated objective was multiplied by.
    pub loss_scale: Option<ValueId>,
    /// Micro-batches per step (1: no accumulation).
    pub accumulate: u32,
}

/// `torch.amp.GradScaler`'s default growth interval: clean steps before the scale doubles.
pub const GROWTH_INTERVAL: u32 = 2000;

/// Adds state and update nodes; returns the new graph (gradients keep their ids).
pub fn run(diff: &Differentiated, options: &OptimizerOptions) -> Result<Graph, StageError> {
    let mut graph = diff.graph.clone();
    let internal = |e: TypeError| StageError::internal("optimizer", e.message);
    let mut origin = Origin {
        span: Span::default(),
        scope: String::new(),
        phase: Phase::Update,
    };
    let mut pairs = diff.grads.clone();
    if options.accumulate > 1 {
        for (param, grad) in &mut pairs {
            let node = graph.node(*param);
            let (Op::Param { name, ty, .. }, span) = (&node.op, node.span) else {
                return Err(StageError::internal(
                    "optimizer",
                    format!("{param} is not a parameter"),
                ));
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
            let op = Op::AccumulateGrad {
                micro_steps: options.accumulate,
            };
            graph.add(op, vec![acc, *grad], &at).map_err(internal)?;
            *grad = acc;
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
            Some(graph.add(op, inputs, &origin).map_err(internal)?)
        }
        _ => None,
    };
    let multiplier = clip.or(unscale);
    for &(param, grad) in &pairs {
        let (name, ty) = match &graph.node(param).op {
            Op::Param { name, ty, .. } => (name.clone(), ty.with_dtype(DType::F32)),
            _ => {
                return Err(StageError::internal(
                    "optimizer",
                    format!("{param} is not a parameter"),
                ))
            }
        };
        origin.span = graph.node(param).span;
        origin.scope = graph.node(param).scope.clone();
        let state = |graph: &mut Graph, suffix: &str| {
            graph
                .add(
                    Op::OptimState {
                        name: format!("{name}.{suffix}"),
                        ty: ty.clone(),
                        init: 0.0,
                    },
                    vec![],
                    &origin,
                )
                .map_err(internal)
        };
        let (op, mut inputs) = match options.optimizer {
            Optimizer::AdamW(p) => {
                let m = state(&mut graph, "exp_avg")?;
                let v = state(&mut graph, "exp_avg_sq")?;
                (Op::AdamW(p), vec![param, grad, m, v])
            }
            Optimizer::Sgd(p) => {
                let b = state(&mut graph, "momentum_buffer")?;
                (Op::Sgd(p), vec![param, grad, b])
            }
        };
        inputs.extend(multiplier);
        graph.add(op, inputs, &origin).map_err(internal)?;
    }
    if let (Some(scale), Some(multiplier)) = (options.loss_scale, unscale) {
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
                &origin,
            )
            .map_err(internal)?;
        graph
            .add(
                Op::LossScaleUpdate {
                    growth_interval: GROWTH_INTERVAL,
                },
                vec![scale, clean, multiplier],
                &origin,
            )
            .map_err(internal)?;
    }
    Ok(graph)
}
