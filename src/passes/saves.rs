//! Which forward values backward reads: where a backward rule offered another form of a node
//! (an [`crate::ops::backward::Alternative`]: the same value, bitwise, from other forward values), this pass picks
//! the form that adds the fewest bytes to the set of forward values backward keeps. A value
//! another backward node reads already is free, so a ReLU's backward reads its output when
//! the next convolution or matrix product keeps that output for its own weight gradient.

use super::autodiff::Differentiated;
use super::StageError;
use crate::ir::*;
use std::collections::{BTreeSet, HashMap};

/// What the pass chose: the graph with the chosen forms, and the bytes of forward values
/// backward no longer reads (the saved activations the choice removes).
#[derive(Debug, Clone)]
pub struct Chosen {
    /// The differentiated graph, each offered node in its cheaper form.
    pub diff: Differentiated,
    /// Bytes of forward values no longer read by backward, less those newly read.
    pub saved_bytes: u64,
}

/// How many backward or update nodes read each forward value that a step computes (sources:
/// parameters and inputs, are kept anyway and count as free).
struct Readers<'g> {
    graph: &'g Graph,
    count: HashMap<ValueId, usize>,
}

impl<'g> Readers<'g> {
    fn of(graph: &'g Graph) -> Readers<'g> {
        let mut readers = Readers {
            graph,
            count: HashMap::new(),
        };
        for v in graph
            .values()
            .filter(|&v| graph.node(v).phase != Phase::Forward)
        {
            readers.add(&graph.node(v).inputs, 1);
        }
        readers
    }

    /// The forward values a step computes among `inputs`, each once.
    fn saved_among(&self, inputs: &[ValueId]) -> BTreeSet<ValueId> {
        inputs
            .iter()
            .copied()
            .filter(|&u| {
                let node = self.graph.node(u);
                node.phase == Phase::Forward && node.op.class() != OpClass::Source
            })
            .collect()
    }

    fn add(&mut self, inputs: &[ValueId], delta: isize) {
        for u in self.saved_among(inputs) {
            let c = self.count.entry(u).or_insert(0);
            *c = c.saturating_add_signed(delta);
        }
    }

    /// Bytes that only a reader of `inputs` keeps: values no other backward node reads
    /// (`others` of the readers counted are this node itself).
    fn own_bytes(&self, inputs: &[ValueId], others: usize) -> u64 {
        self.saved_among(inputs)
            .into_iter()
            .filter(|u| self.count.get(u).copied().unwrap_or(0) <= others)
            .map(|u| self.graph.node(u).ty.bytes())
            .sum()
    }
}

/// Picks, for each offered node, the form that keeps fewer bytes of forward values alive
/// for backward (ties keep the form the rule built), repeating until no swap helps. The
/// chosen forms compute bitwise the same values, so gradients are unchanged.
pub fn choose(diff: Differentiated) -> Result<Chosen, StageError> {
    let graph = &diff.graph;
    let mut readers = Readers::of(graph);
    // Each offered node is in its built form or in the alternative one (`true`).
    let mut swapped = vec![false; diff.alternatives.len()];
    let mut saved: i128 = 0;
    for _ in 0..4 {
        let mut changed = false;
        for (alt, swapped) in diff.alternatives.iter().zip(swapped.iter_mut()) {
            let built = &graph.node(alt.node).inputs;
            let (now, other) = if *swapped {
                (&alt.inputs, built)
            } else {
                (built, &alt.inputs)
            };
            let keep = readers.own_bytes(now, 1);
            let swap = readers.own_bytes(other, 0);
            if swap < keep {
                readers.add(now, -1);
                readers.add(other, 1);
                saved += i128::from(keep) - i128::from(swap);
                *swapped = !*swapped;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let current: HashMap<ValueId, (Op, Vec<ValueId>)> = diff
        .alternatives
        .iter()
        .zip(&swapped)
        .filter(|(_, &s)| s)
        .map(|(a, _)| (a.node, (a.op.clone(), a.inputs.clone())))
        .collect();
    let graph = rebuilt(graph, &current)?;
    Ok(Chosen {
        diff: Differentiated {
            graph,
            grads: diff.grads,
            alternatives: Vec::new(),
        },
        saved_bytes: u64::try_from(saved.max(0)).unwrap_or(u64::MAX),
    })
}

/// `graph` with the nodes in `replaced` computed by their new op and inputs; every value
/// keeps its id, since nodes are re-added in creation order.
fn rebuilt(
    graph: &Graph,
    replaced: &HashMap<ValueId, (Op, Vec<ValueId>)>,
) -> Result<Graph, StageError> {
    let mut out = Graph::new();
    for v in graph.values() {
        let node = graph.node(v);
        let (op, inputs) = replaced
            .get(&v)
            .cloned()
            .unwrap_or_else(|| (node.op.clone(), node.inputs.clone()));
        let origin = node.origin();
        let id = out
            .add(op, inputs, &origin)
            .map_err(|e| StageError::internal("saves", format!("{v}: {}", e.message)))?;
        if id != v || out.node(id).ty != node.ty {
            return Err(StageError::internal(
                "saves",
                format!("{v}: the other form changes the value's id or type"),
            ));
        }
    }
    out.outputs = graph.outputs.clone();
    Ok(out)
}
