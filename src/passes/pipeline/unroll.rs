//! One stage's forward graph: the model's inputs bound whole (the micro-batch size times
//! `M` rows), the parameters that live on it (a parameter read on several stages lives on
//! the first and is sent to the others like an activation), and, for each micro-batch `m`
//! in turn, a copy of the stage's ops reading rows `m * b..(m + 1) * b` of each input,
//! receiving what earlier stages computed and sending what later stages read. Values that
//! depend on no input and no parameter (tables, masks) are computed once on each stage
//! that reads them, for all its micro-batches, instead of sent.

use super::stages::Assignment;
use super::SplitError;
use crate::ir::{BinaryFn, Graph, Op, Origin, Phase, PipeLink, TypeError, ValueId};
use std::collections::HashMap;

fn internal(e: TypeError) -> SplitError {
    SplitError::Internal(crate::passes::StageError::internal("pipeline", e.message))
}

/// What a stage's copy reads of the model: its inputs (whole), its parameters, and which
/// values are trained (depend on a trained parameter) or constant (on nothing bound).
struct Model<'g> {
    graph: &'g Graph,
    stage: &'g Assignment,
    trained: Vec<bool>,
    constant: Vec<bool>,
}

/// The stage graph under construction and the micro-batch being copied.
struct Copy<'g> {
    model: &'g Model<'g>,
    out: Graph,
    own: u32,
    micro: u32,
    /// Model value -> stage value, for the values every micro-batch shares: inputs (whole),
    /// parameters and constants.
    bound: HashMap<ValueId, ValueId>,
    /// Model value -> stage value in this micro-batch.
    map: HashMap<ValueId, ValueId>,
}

impl Copy<'_> {
    /// The stage's value for model value `v` in this micro-batch: copied, sliced, received
    /// or recomputed on first use.
    fn value(&mut self, v: ValueId) -> Result<ValueId, SplitError> {
        if let Some(&w) = self.map.get(&v) {
            return Ok(w);
        }
        let m = self.model;
        let node = m.graph.node(v);
        let w = match (&node.op, self.bound.get(&v)) {
            (Op::Input { .. }, Some(&whole)) => {
                let rows = node.ty.shape.first().copied().unwrap_or(1);
                let at = self.micro as usize * rows;
                let slice = Op::Slice {
                    axis: 0,
                    start: at,
                    end: at + rows,
                };
                self.add(slice, vec![whole], node.origin())?
            }
            (_, Some(&shared)) => return Ok(shared),
            _ if m.stage[v.index()] == self.own || m.constant[v.index()] => {
                let inputs = (node.inputs.iter())
                    .map(|&i| self.value(i))
                    .collect::<Result<Vec<_>, _>>()?;
                let w = self.add(of_micro(&node.op, self.micro), inputs, node.origin())?;
                if m.constant[v.index()] {
                    // One copy serves every micro-batch.
                    self.bound.insert(v, w);
                    return Ok(w);
                }
                w
            }
            _ => {
                let recv = Op::PipelineRecv {
                    link: self.link(m.stage[v.index()], v),
                    ty: node.ty.clone(),
                    trained: m.trained[v.index()],
                };
                self.add(recv, vec![], node.origin())?
            }
        };
        self.map.insert(v, w);
        Ok(w)
    }

    fn link(&self, peer: u32, v: ValueId) -> PipeLink {
        PipeLink {
            peer,
            micro: self.micro,
            value: v.0,
            gradient: false,
        }
    }

    fn add(&mut self, op: Op, inputs: Vec<ValueId>, origin: Origin) -> Result<ValueId, SplitError> {
        self.out.add(op, inputs, &origin).map_err(internal)
    }
}

/// `op` as micro-batch `micro`'s copy runs it: a dropout draws masks of its own for each
/// micro-batch (its seed mixed with the micro-batch; micro-batch 0 keeps it).
fn of_micro(op: &Op, micro: u32) -> Op {
    match op {
        Op::Dropout { p, seed } => Op::Dropout {
            p: *p,
            seed: seed ^ u64::from(micro).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        },
        op => op.clone(),
    }
}

/// Stage `own`'s forward graph over `micro` micro-batches (see the module doc); its output
/// `loss` as [`super::Stages`] says.
pub(super) fn stage_graph(
    graph: &Graph,
    stage: &Assignment,
    own: u32,
    micro: u32,
) -> Result<Graph, SplitError> {
    let last = stage.iter().copied().max().unwrap_or(0);
    let mut trained = vec![false; graph.len()];
    let mut constant = vec![false; graph.len()];
    for v in graph.values() {
        let node = graph.node(v);
        let inputs = || node.inputs.iter();
        trained[v.index()] = node.ty.dtype.is_float()
            && (matches!(node.op, Op::Param { frozen: false, .. })
                || inputs().any(|i| trained[i.index()]));
        constant[v.index()] = !matches!(node.op, Op::Param { .. } | Op::Input { .. })
            && inputs().all(|i| constant[i.index()]);
    }
    let model = Model {
        graph,
        stage,
        trained,
        constant,
    };
    let mut copy = Copy {
        model: &model,
        out: Graph::new(),
        own,
        micro: 0,
        bound: HashMap::new(),
        map: HashMap::new(),
    };
    for v in graph.values() {
        let node = graph.node(v);
        let op = match &node.op {
            Op::Input { name, ty } => {
                let mut ty = ty.clone();
                if let Some(rows) = ty.shape.first_mut() {
                    *rows *= micro as usize;
                }
                let name = name.clone();
                Op::Input { name, ty }
            }
            Op::Param { .. } if stage[v.index()] == own => node.op.clone(),
            _ => continue,
        };
        let w = copy.add(op, vec![], node.origin())?;
        copy.bound.insert(v, w);
    }
    let loss = graph.output("loss");
    let mut ends = Vec::new();
    for m in 0..micro {
        copy.micro = m;
        copy.map.clear();
        for v in graph.values().filter(|v| stage[v.index()] == own) {
            let node = graph.node(v);
            if matches!(node.op, Op::Input { .. }) || model.constant[v.index()] {
                continue;
            }
            let w = copy.value(v)?;
            let mut peers: Vec<u32> = (graph.users(v).iter())
                .map(|u| stage[u.index()])
                .filter(|&t| t != own)
                .collect();
            peers.sort_unstable();
            peers.dedup();
            for peer in peers {
                let send = Op::PipelineSend(copy.link(peer, v));
                ends.push(copy.add(send, vec![w], node.origin())?);
            }
            if Some(v) == loss && own == last {
                ends.push(w);
            }
        }
    }
    let origin = Origin {
        span: loss.map(|l| graph.node(l).span).unwrap_or_default(),
        scope: String::new(),
        phase: Phase::Forward,
    };
    let Some(&first) = ends.first() else {
        return Err(SplitError::Internal(crate::passes::StageError::internal(
            "pipeline",
            format!("stage {own} neither sends anything nor computes the loss"),
        )));
    };
    let mut total = first;
    for &end in &ends[1..] {
        total = copy.add(Op::Binary(BinaryFn::Add), vec![total, end], origin.clone())?;
    }
    if own == last && micro > 1 {
        let ty = copy.out.node(total).ty.clone();
        let mean = Op::Fill {
            value: 1.0 / micro as f32,
            ty,
        };
        let scale = copy.add(mean, vec![], origin.clone())?;
        total = copy.add(Op::Binary(BinaryFn::Mul), vec![total, scale], origin)?;
    }
    let mut out = copy.out;
    out.outputs.push(("loss".into(), total));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Micro-batch 0's dropout keeps the model's seed; the others draw seeds of their own.
    #[test]
    fn each_micro_batch_draws_its_own_dropout_masks() {
        let seeds: Vec<Op> = (0..3)
            .map(|m| of_micro(&Op::Dropout { p: 0.1, seed: 5 }, m))
            .collect();
        assert_eq!(seeds[0], Op::Dropout { p: 0.1, seed: 5 });
        assert_ne!(seeds[1], seeds[0]);
        assert_ne!(seeds[2], seeds[1]);
    }
}
