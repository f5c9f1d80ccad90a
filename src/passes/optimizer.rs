//! Appends the optimizer as graph ops: for each parameter with a gradient, its persistent
//! state (AdamW: two fp32 moments; SGD with momentum: one buffer) and an in-place update
//! node; with global-norm clipping, one clip coefficient computed from all gradients.

use super::autodiff::Differentiated;
use super::StageError;
use crate::front::train::Optimizer;
use crate::ir::*;

/// Training settings the optimizer pass needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OptimizerOptions {
    pub optimizer: Optimizer,
    pub clip_grad_norm: Option<f32>,
}

/// Adds state and update nodes; returns the new graph (gradients keep their ids).
pub fn run(diff: &Differentiated, options: &OptimizerOptions) -> Result<Graph, StageError> {
    let mut graph = diff.graph.clone();
    let internal = |e: TypeError| StageError::internal("optimizer", e.message);
    let mut origin = Origin {
        span: Span::default(),
        scope: String::new(),
        phase: Phase::Update,
    };
    let clip = match options.clip_grad_norm {
        Some(max_norm) if !diff.grads.is_empty() => {
            let grads = diff.grads.iter().map(|&(_, g)| g).collect();
            Some(
                graph
                    .add(Op::ClipCoefficient { max_norm }, grads, &origin)
                    .map_err(internal)?,
            )
        }
        _ => None,
    };
    for &(param, grad) in &diff.grads {
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
        inputs.extend(clip);
        graph.add(op, inputs, &origin).map_err(internal)?;
    }
    Ok(graph)
}
