//! Reverse-mode autodiff as a graph rewrite: appends, for every forward node on a path from
//! a parameter to the loss, the backward ops of its vector-Jacobian product. Backward values
//! are ordinary graph values; integer values never get gradients; a value used several times
//! (tied embeddings) gets the sum of its gradients.

use super::StageError;
use crate::ir::*;
use crate::ops::backward::{Alternative, Vjp};
use std::collections::HashMap;

/// The graph extended with backward nodes, and each parameter's gradient value.
#[derive(Debug, Clone)]
pub struct Differentiated {
    pub graph: Graph,
    /// `(parameter, gradient)` for every parameter the loss depends on, in parameter order.
    pub grads: Vec<(ValueId, ValueId)>,
    /// Other forms of backward nodes, which read other forward values for the same result;
    /// [`super::saves::choose`] picks among them.
    pub alternatives: Vec<Alternative>,
}

/// The graph being extended with backward nodes; backward rules add their ops through it.
/// Every node it adds carries the phase `Backward` and the span and scope of the forward
/// node being differentiated.
pub struct Rewriter {
    graph: Graph,
    origin: Origin,
    alternatives: Vec<Alternative>,
}

impl Rewriter {
    /// Appends `op` applied to `inputs` and returns its value; a type error is internal.
    pub fn add(&mut self, op: Op, inputs: Vec<ValueId>) -> Result<ValueId, StageError> {
        self.graph
            .add(op, inputs, &self.origin)
            .map_err(|e| StageError::internal("autodiff", e.message))
    }

    /// Records that `op` applied to `inputs` computes the same value as the backward node
    /// `node` (bitwise), reading other forward values; the saves pass may swap them.
    pub fn offer(&mut self, node: ValueId, op: Op, inputs: Vec<ValueId>) {
        self.alternatives.push(Alternative { node, op, inputs });
    }

    /// The shape of value `v`.
    pub fn shape(&self, v: ValueId) -> Vec<usize> {
        self.graph.node(v).ty.shape.clone()
    }

    /// The dtype of value `v`.
    pub fn dtype(&self, v: ValueId) -> DType {
        self.graph.node(v).ty.dtype
    }

    /// Reduces a broadcast gradient `g` back to `like`'s shape: one `SumTo` over the broadcast
    /// axes (the leading axes `like` lacks included); no node when already equal.
    pub fn sum_to(&mut self, g: ValueId, like: ValueId) -> Result<ValueId, StageError> {
        let target = self.shape(like);
        if self.shape(g) == target {
            return Ok(g);
        }
        self.add(Op::sum_to(target), vec![g])
    }
}

/// The sum of a value's gradient parts `read`, collected from its last reader back,
/// added from its first reader on.
fn sum_from_first_reader(rw: &mut Rewriter, read: Vec<ValueId>) -> Result<ValueId, StageError> {
    let mut ordered = read.into_iter().rev();
    let first = ordered
        .next()
        .ok_or_else(|| StageError::internal("autodiff", "a gradient of no parts"))?;
    ordered.try_fold(first, |total, g| {
        rw.add(Op::Binary(BinaryFn::Add), vec![total, g])
    })
}

/// Sends the gradient `dy` of a received value back to the stage it came from (zeros of
/// `ty` when nothing on this stage differentiates it, so the sender's receive always meets
/// a send).
fn send_back(
    rw: &mut Rewriter,
    link: PipeLink,
    dy: Option<ValueId>,
    ty: &TensorType,
) -> Result<(), StageError> {
    let dy = match dy {
        Some(dy) => dy,
        None => rw.add(
            Op::Fill {
                value: 0.0,
                ty: ty.clone(),
            },
            vec![],
        )?,
    };
    rw.add(Op::PipelineSend(link.gradient()), vec![dy])?;
    Ok(())
}

/// Differentiates `loss` with respect to every trained (not frozen) parameter it depends on;
/// backward work that only frozen parameters would need is never built.
pub fn run(graph: &Graph, loss: ValueId) -> Result<Differentiated, StageError> {
    let n = graph.len();
    let mut requires = vec![false; n];
    for v in graph.values() {
        let node = graph.node(v);
        requires[v.index()] = node.ty.dtype.is_float()
            && (matches!(
                node.op,
                Op::Param { frozen: false, .. } | Op::PipelineRecv { trained: true, .. }
            ) || node.inputs.iter().any(|i| requires[i.index()]));
    }
    let mut rw = Rewriter {
        graph: graph.clone(),
        origin: Origin {
            span: Span::default(),
            scope: String::new(),
            phase: Phase::Backward,
        },
        alternatives: Vec::new(),
    };
    let mut grads: HashMap<ValueId, ValueId> = HashMap::new();
    // On a pipeline stage, the gradient parts of a value every micro-batch shares (one
    // input-independent: a parameter, a weight's cast) are summed when the sweep reaches
    // the value, from the first reader on (micro-batch order), so 1F1B adds each part as
    // soon as its backward is done instead of keeping every part until the last one's.
    let pipelined = graph.values().any(|v| {
        matches!(
            graph.node(v).op,
            Op::PipelineRecv { .. } | Op::PipelineSend(_)
        )
    });
    let shared: Vec<bool> = match pipelined {
        true => graph.input_dependent().into_iter().map(|d| !d).collect(),
        false => vec![false; n],
    };
    let mut parts: HashMap<ValueId, Vec<ValueId>> = HashMap::new();
    if requires[loss.index()] {
        let seed_ty = graph.node(loss).ty.clone();
        rw.origin.span = graph.node(loss).span;
        let seed = rw.add(
            Op::Fill {
                value: 1.0,
                ty: seed_ty,
            },
            vec![],
        )?;
        grads.insert(loss, seed);
    }
    for y in (0..=loss.index()).rev().map(|i| ValueId(i as u32)) {
        let node = graph.node(y);
        rw.origin.span = node.span;
        rw.origin.scope = node.scope.clone();
        if let Some(read) = parts.remove(&y) {
            grads.insert(y, sum_from_first_reader(&mut rw, read)?);
        }
        if let Op::PipelineRecv {
            link,
            trained: true,
            ..
        } = &node.op
        {
            send_back(&mut rw, *link, grads.get(&y).copied(), &node.ty)?;
            continue;
        }
        let Some(&dy) = grads.get(&y) else { continue };
        if node.inputs.is_empty() {
            continue;
        }
        let wants: Vec<bool> = node.inputs.iter().map(|i| requires[i.index()]).collect();
        let mut cx = Vjp::new(&mut rw, y, dy, &node.inputs, &wants);
        crate::ops::family(&node.op).vjp(&node.op, &mut cx)?;
        let input_grads = cx.into_grads();
        for (&x, g) in node.inputs.iter().zip(input_grads) {
            let Some(g) = g else { continue };
            if shared[x.index()] {
                parts.entry(x).or_default().push(g);
                continue;
            }
            let total = match grads.get(&x) {
                Some(&prev) => rw.add(Op::Binary(BinaryFn::Add), vec![prev, g])?,
                None => g,
            };
            grads.insert(x, total);
        }
    }
    let grads = graph
        .params()
        .into_iter()
        .filter_map(|p| grads.get(&p).map(|&g| (p, g)))
        .collect();
    Ok(Differentiated {
        graph: rw.graph,
        grads,
        alternatives: rw.alternatives,
    })
}
