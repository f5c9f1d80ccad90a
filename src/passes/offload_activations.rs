//! Saved activations offloaded to the host (`offload = activations`): after checkpointing
//! has chosen what backward reads from the forward, each such activation is copied to the
//! host arena as soon as it is computed (`copy_to_host`, a forward step) and copied into a
//! new device buffer just before its first backward reader (`copy_from_host`, a backward
//! step made right before that reader, so the schedule runs it there), and its backward
//! readers read that copy. On the device the activation then lives from its producer to its
//! last forward reader and again from its prefetch to its last backward reader, instead of
//! across the whole step between. Copies move bytes unchanged: the step computes the same
//! bits as without them.

use super::StageError;
use crate::ir::{Graph, Op, OpClass, Origin, Phase, ValueId};
use std::collections::BTreeMap;

/// A graph with its saved activations offloaded, and where each old value went.
#[derive(Debug, Clone)]
pub struct Offloaded {
    /// The rewritten graph.
    pub graph: Graph,
    /// The new value of each old one (an offloaded activation maps to its device value, the
    /// one its forward readers read).
    pub map: Vec<ValueId>,
}

fn internal(v: ValueId, message: String) -> StageError {
    StageError::internal("offload_activations", format!("{v}: {message}"))
}

/// The forward values that backward reads: computed (not bound from outside), depending on
/// the step's inputs (not a weight copy), of at least one byte.
fn saved(graph: &Graph) -> Vec<bool> {
    let dependent = graph.input_dependent();
    let mut saved = vec![false; graph.len()];
    for v in graph.values() {
        let node = graph.node(v);
        saved[v.index()] = node.phase == Phase::Forward
            && node.op.class() != OpClass::Source
            && dependent[v.index()]
            && node.ty.bytes() > 0
            && graph
                .users(v)
                .iter()
                .any(|&u| graph.node(u).phase == Phase::Backward);
    }
    saved
}

/// `graph` with every saved activation offloaded (see the module doc); every other node is
/// copied unchanged in creation order.
pub fn run(graph: &Graph) -> Result<Offloaded, StageError> {
    let saved = saved(graph);
    let mut out = Graph::new();
    let mut map: Vec<ValueId> = Vec::with_capacity(graph.len());
    let mut host: BTreeMap<ValueId, ValueId> = BTreeMap::new();
    let mut fetched: BTreeMap<ValueId, ValueId> = BTreeMap::new();
    for v in graph.values() {
        let node = graph.node(v);
        let backward = node.phase == Phase::Backward;
        let mut inputs = Vec::with_capacity(node.inputs.len());
        for &i in &node.inputs {
            let new = match host.get(&i) {
                Some(&h) if backward => match fetched.get(&i) {
                    Some(&d) => d,
                    None => {
                        let at = Origin {
                            phase: Phase::Backward,
                            ..graph.node(i).origin()
                        };
                        let d = out
                            .add(Op::CopyFromHost, vec![h], &at)
                            .map_err(|e| internal(i, e.message))?;
                        fetched.insert(i, d);
                        d
                    }
                },
                _ => map[i.index()],
            };
            inputs.push(new);
        }
        let id = out
            .add(node.op.clone(), inputs, &node.origin())
            .map_err(|e| internal(v, e.message))?;
        map.push(id);
        if saved[v.index()] {
            let h = out
                .add(Op::CopyToHost, vec![id], &node.origin())
                .map_err(|e| internal(v, e.message))?;
            host.insert(v, h);
        }
    }
    for (name, v) in &graph.outputs {
        out.outputs.push((name.clone(), map[v.index()]));
    }
    Ok(Offloaded { graph: out, map })
}
