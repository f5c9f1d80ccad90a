//! Rebuilding a graph with some nodes folded away: the shared step of the peephole passes
//! (`widen`, `concat_grads`, and the folds that absorb a producer: `bias_epilogue`,
//! `promote`, `norm_accumulate`). Nodes are copied in creation order; an edited node is dropped,
//! made an alias of an earlier value, or rebuilt with a new op and inputs.

use super::autodiff::Differentiated;
use super::StageError;
use crate::ir::{Graph, Op, ValueId};
use std::collections::{BTreeMap, BTreeSet};

/// What becomes of one node of the old graph.
pub enum Edit {
    /// Copied as it is.
    Keep,
    /// Not copied: its readers read this earlier old value instead.
    Alias(ValueId),
    /// Not copied; only other dropped or rebuilt nodes may read it.
    Drop,
    /// Copied with this op and these (old) inputs.
    Rebuild(Op, Vec<ValueId>),
}

/// `graph` rebuilt under `edit` (called once per node, in creation order): the new graph and
/// each old value's new one (`None` for a dropped node). Graph outputs follow their values;
/// a kept node that reads a dropped one is an internal error of `pass`.
pub fn rebuild(
    graph: &Graph,
    pass: &'static str,
    mut edit: impl FnMut(ValueId) -> Edit,
) -> Result<(Graph, Vec<Option<ValueId>>), StageError> {
    let mut out = Graph::new();
    let mut map: Vec<Option<ValueId>> = Vec::with_capacity(graph.len());
    let mapped = |map: &[Option<ValueId>], v: ValueId| {
        map.get(v.index())
            .copied()
            .flatten()
            .ok_or_else(|| StageError::internal(pass, format!("{v} read where it was folded away")))
    };
    for v in graph.values() {
        let node = graph.node(v);
        let (op, inputs) = match edit(v) {
            Edit::Keep => (node.op.clone(), node.inputs.clone()),
            Edit::Alias(to) => {
                map.push(Some(mapped(&map, to)?));
                continue;
            }
            Edit::Drop => {
                map.push(None);
                continue;
            }
            Edit::Rebuild(op, inputs) => (op, inputs),
        };
        let inputs = inputs
            .iter()
            .map(|&i| mapped(&map, i))
            .collect::<Result<Vec<_>, _>>()?;
        let id = out
            .add(op, inputs, &node.origin())
            .map_err(|e| StageError::internal(pass, format!("{v}: {}", e.message)))?;
        map.push(Some(id));
    }
    for (name, v) in &graph.outputs {
        out.outputs.push((name.clone(), mapped(&map, *v)?));
    }
    Ok((out, map))
}

/// What a fold makes of one node that absorbs the producer of one of its inputs: that
/// producer (read by nothing else), the node's new op and its new (old) inputs.
pub type Absorbed = (ValueId, Op, Vec<ValueId>);

/// `graph` with every node for which `absorbs` (given the graph outputs) names an
/// [`Absorbed`] rebuilt with its op and inputs and the absorbed producer dropped: the new
/// graph and each old value's new one (`None` for an absorbed producer).
pub fn absorb(
    graph: &Graph,
    pass: &'static str,
    absorbs: impl Fn(&Graph, ValueId, &BTreeSet<ValueId>) -> Option<Absorbed>,
) -> Result<(Graph, Vec<Option<ValueId>>), StageError> {
    let outputs: BTreeSet<ValueId> = graph.outputs.iter().map(|(_, v)| *v).collect();
    let rebuilt: BTreeMap<ValueId, Absorbed> = graph
        .values()
        .filter_map(|v| absorbs(graph, v, &outputs).map(|a| (v, a)))
        .collect();
    let absorbed: BTreeSet<ValueId> = rebuilt.values().map(|(p, _, _)| *p).collect();
    rebuild(graph, pass, |v| match rebuilt.get(&v) {
        Some((_, op, inputs)) => Edit::Rebuild(op.clone(), inputs.clone()),
        None if absorbed.contains(&v) => Edit::Drop,
        None => Edit::Keep,
    })
}

/// The new value of each of `pairs` (a parameter and its gradient) under `map`.
pub fn remap_pairs(
    pairs: &[(ValueId, ValueId)],
    map: &[Option<ValueId>],
    pass: &'static str,
) -> Result<Vec<(ValueId, ValueId)>, StageError> {
    let get = |v: ValueId| {
        map.get(v.index())
            .copied()
            .flatten()
            .ok_or_else(|| StageError::internal(pass, format!("gradient pair {v} folded away")))
    };
    pairs.iter().map(|&(p, g)| Ok((get(p)?, get(g)?))).collect()
}

/// A differentiated graph through `fold`, a pass that only folds nodes away or rebuilds
/// them (no new gradients): its gradients follow their values, its alternatives are
/// dropped (taken already); also each old value's new one, for the values the caller holds.
pub fn refold(
    diff: &Differentiated,
    pass: &'static str,
    fold: impl Fn(&Graph) -> Result<(Graph, Vec<Option<ValueId>>), StageError>,
) -> Result<(Differentiated, Vec<Option<ValueId>>), StageError> {
    let (graph, map) = fold(&diff.graph)?;
    let diff = Differentiated {
        graph,
        grads: remap_pairs(&diff.grads, &map, pass)?,
        alternatives: Vec::new(),
    };
    Ok((diff, map))
}
