//! Rebuilding a graph with some nodes folded away: the shared step of the peephole passes
//! (`widen`, `concat_grads`, and the folds that absorb a producer: `bias_epilogue`,
//! `promote`, `norm_accumulate`). Nodes are copied in creation order; an edited node is dropped,
//! made an alias of an earlier value, or rebuilt with a new op and inputs.

use super::autodiff::Differentiated;
use super::StageError;
use crate::ir::{Graph, Op, ValueId};
use std::collections::{BTreeMap, BTreeSet};

/// The values some step writes in place (an update's parameter and moments): no merged
/// op's output may stand for them.
pub fn written_in_place(graph: &Graph) -> BTreeSet<ValueId> {
    (graph.values())
        .flat_map(|v| {
            let node = graph.node(v);
            (node.op.mutated_inputs().iter())
                .filter_map(|&i| node.inputs.get(i).copied())
                .collect::<Vec<_>>()
        })
        .collect()
}

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
    for v in graph.values() {
        let node = graph.node(v);
        let (op, inputs) = match edit(v) {
            Edit::Keep => (node.op.clone(), node.inputs.clone()),
            Edit::Alias(to) => {
                map.push(Some(mapped(&map, to, pass)?));
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
            .map(|&i| mapped(&map, i, pass))
            .collect::<Result<Vec<_>, _>>()?;
        let id = out
            .add(op, inputs, &node.origin())
            .map_err(|e| StageError::internal(pass, format!("{v}: {}", e.message)))?;
        map.push(Some(id));
    }
    for (name, v) in &graph.outputs {
        out.outputs.push((name.clone(), mapped(&map, *v, pass)?));
    }
    Ok((out, map))
}

/// The new value of old value `v` under `map`, or `pass`'s internal error where it has none
/// (read where it was folded away, or before it was rebuilt).
fn mapped(map: &[Option<ValueId>], v: ValueId, pass: &'static str) -> Result<ValueId, StageError> {
    map.get(v.index())
        .copied()
        .flatten()
        .ok_or_else(|| StageError::internal(pass, format!("{v} read where it was folded away")))
}

/// How a pass that rebuilds nodes into several reaches the graph being built: the new
/// value of an old one, and adding a node with an old node's origin.
pub struct Builder<'a> {
    /// The graph being built.
    pub out: &'a mut Graph,
    old: &'a Graph,
    map: &'a [Option<ValueId>],
    pass: &'static str,
}

impl Builder<'_> {
    /// The new value of old value `v` (an internal error where it has none yet).
    pub fn new_of(&self, v: ValueId) -> Result<ValueId, StageError> {
        mapped(self.map, v, self.pass)
    }

    /// Adds `op` on the (new) `inputs` with old node `like`'s origin.
    pub fn add(
        &mut self,
        like: ValueId,
        op: Op,
        inputs: Vec<ValueId>,
    ) -> Result<ValueId, StageError> {
        (self.out.add(op, inputs, &self.old.node(like).origin()))
            .map_err(|e| StageError::internal(self.pass, format!("{like}: {}", e.message)))
    }

    /// Copies old node `v` as it is, on its inputs' new values.
    pub fn copy(&mut self, v: ValueId) -> Result<ValueId, StageError> {
        let node = self.old.node(v);
        let inputs = (node.inputs.iter())
            .map(|&i| self.new_of(i))
            .collect::<Result<Vec<_>, _>>()?;
        self.add(v, node.op.clone(), inputs)
    }
}

/// `graph` rebuilt node by node in creation order, `each` giving each old node's new value
/// (adding what nodes it needs through the [`Builder`]): the new graph and each old value's
/// new one. Graph outputs follow their values.
pub fn rebuild_each(
    graph: &Graph,
    pass: &'static str,
    each: impl FnMut(&mut Builder<'_>, ValueId) -> Result<ValueId, StageError>,
) -> Result<(Graph, Vec<Option<ValueId>>), StageError> {
    let order: Vec<ValueId> = graph.values().collect();
    rebuild_in_order(graph, pass, &order, each)
}

/// [`rebuild_each`] visiting the old nodes in `order` (each exactly once, every node after
/// the nodes it reads): a node moved later is rebuilt where it is visited.
pub fn rebuild_in_order(
    graph: &Graph,
    pass: &'static str,
    order: &[ValueId],
    mut each: impl FnMut(&mut Builder<'_>, ValueId) -> Result<ValueId, StageError>,
) -> Result<(Graph, Vec<Option<ValueId>>), StageError> {
    let mut out = Graph::new();
    let mut map: Vec<Option<ValueId>> = vec![None; graph.len()];
    for &v in order {
        let mut b = Builder {
            out: &mut out,
            old: graph,
            map: &map,
            pass,
        };
        let new = each(&mut b, v)?;
        map[v.index()] = Some(new);
    }
    if map.iter().any(Option::is_none) {
        return Err(StageError::internal(pass, "a node left out of the order"));
    }
    for (name, v) in &graph.outputs {
        out.outputs.push((name.clone(), mapped(&map, *v, pass)?));
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
