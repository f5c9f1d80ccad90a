//! Activation checkpointing: which forward values backward reads from memory and which it
//! recomputes. Policies:
//!
//! - keep-all saves every value backward reads;
//! - pointwise (the default of AOTAutograd's partitioner behind `torch.compile`, plus
//!   normalizations) is the min-cut below with only pointwise ops, normalizations and views
//!   recomputable: backward recomputes an activation such as `gelu(h)` or
//!   `relu(batchnorm(h))` from an input it saves anyway rather than saving both;
//! - segments (Chen et al. 2016; per-block checkpointing when every block is a segment)
//!   save the output of every k-th block instance and recompute the rest of each segment;
//! - selective (Korthikanti et al. 2022) keeps the outputs of heavy ops and recomputes the
//!   cheap ops inside block instances;
//! - min-cut (petgraph's Dinic max-flow on a flow network over forward values, as in
//!   AOTAutograd's partitioner): each value `v` becomes `v_in -> v_out` with capacity = its
//!   bytes (saving it); `u_out -> v_in` is infinite for each data edge; values backward reads
//!   are tied to the sink; `source -> v_in` carries the price of recomputing `v`: one byte
//!   for cheap ops (of two cuts of equal bytes, the one recomputing fewer ops wins),
//!   `penalty x FLOPs` for heavy and random ops (infinite when they are banned).
//!
//! Under every policy, keep-all included, two kinds of cast are recomputed rather than saved,
//! both exact, so gradients keep their bits: a cast that widens a low-precision activation to
//! fp32, from its saved input (half the bytes), and a low-precision copy of a parameter, from
//! the parameter, which lives through the step anyway (a bf16 matmul's backward then holds
//! its weight copy only while its block is differentiated, not from forward on: mixed
//! precision saves no more than fp32). Values that flow from one block instance into
//! another are never recomputed by min-cut and selective (saved when needed), so
//! recomputation stays inside a block and backward recomputes one block at a time. The
//! rewrite clones each recomputed value just before its first
//! backward reader, from the saved values, with identical kernels (and dropout keys), so
//! results are bitwise equal.

mod knapsack;

pub use knapsack::savings as knapsack_savings;

use super::StageError;
use crate::ir::cost::flops;
use crate::ir::*;
use petgraph::graph::{DiGraph, NodeIndex};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// How to choose the values to recompute.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Policy {
    /// Save every value backward reads; only widening casts and weight copies are recomputed.
    KeepAll,
    /// Min-cut; heavy and random ops cost `penalty` bytes per FLOP to recompute, or are never
    /// recomputed when `penalty` is `None`.
    MinCut { penalty: Option<f64> },
    /// Min-cut in which only pointwise ops (unary, binary, affine, casts), normalizations and
    /// movement without arithmetic (reshape, permute, slice, broadcast) may be recomputed,
    /// inside block instances: the recomputation costs memory passes (a norm's two: its
    /// statistics, then its output), no matmul.
    Pointwise,
    /// Chen et al. 2016: save the boundary values (those read by another instance or outside
    /// blocks) of every `every`-th block instance, counted in creation order across all
    /// blocks, and everything outside blocks; recompute the rest of each segment from its
    /// saved values. `every = 1` is per-block checkpointing (PyTorch's `checkpoint()` around
    /// each block): every instance's input is saved and backward recomputes one instance at
    /// a time.
    Segments { every: usize },
    /// Per-block checkpointing of the first `count` block instances (in creation order):
    /// their inputs saved, each recomputed in backward one at a time; everywhere else the
    /// pointwise policy. Between pointwise (`count = 0`) and per-block (every instance), each
    /// instance trades what it saves for one recompute of it (the PyTorch practice of
    /// checkpointing only some layers).
    FirstBlocks { count: usize },
    /// Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
    /// Models": inside block instances, recompute every op of class `Cheap` (pointwise ops,
    /// casts of activations, movement, norms, reductions, softmax, pooling, rope, embedding
    /// lookups, losses) and `Random` (dropout), and the separable attention core: matmuls
    /// of two activations that feed a softmax or read one through such ops (`q @ k^T` and
    /// `p @ v` of attention written out). Heavy ops (matmuls with a weight, convolutions,
    /// the fused attention op, whose backward reads only `q, k, v`) keep their outputs, as
    /// do boundary values and everything outside blocks.
    Selective,
    /// Per block instance, pointwise, selective or whole recomputation, chosen by knapsack to
    /// save at least `saving` bytes beyond what pointwise recomputation saves for the fewest
    /// recomputed FLOPs (see `knapsack`).
    Knapsack { saving: u64 },
}

/// A value's top-level block instance (`layer.3` of `layer.3.attn.0`), empty outside blocks.
pub fn instance(scope: &str) -> &str {
    let mut dots = scope.match_indices('.').map(|(i, _)| i);
    match (dots.next(), dots.next()) {
        (Some(_), Some(second)) => &scope[..second],
        _ => scope,
    }
}

/// Every top-level block instance, numbered in the order its first value was created.
fn instance_order(graph: &Graph) -> BTreeMap<&str, usize> {
    let mut order = BTreeMap::new();
    for v in graph.values() {
        let own = instance(&graph.node(v).scope);
        if !own.is_empty() && !order.contains_key(own) {
            order.insert(own, order.len());
        }
    }
    order
}

fn is_forward_compute(graph: &Graph, v: ValueId) -> bool {
    let node = graph.node(v);
    node.phase == Phase::Forward && node.op.class() != OpClass::Source
}

/// Whether a forward op of another block instance (or outside blocks) reads `v`.
fn crosses_block(graph: &Graph, v: ValueId) -> bool {
    let own = instance(&graph.node(v).scope);
    graph
        .users(v)
        .into_iter()
        .any(|u| graph.node(u).phase == Phase::Forward && instance(&graph.node(u).scope) != own)
}

/// Forward values that some backward or update node reads.
fn needed(graph: &Graph) -> BTreeSet<ValueId> {
    graph
        .values()
        .filter(|&v| graph.node(v).phase != Phase::Forward)
        .flat_map(|v| graph.node(v).inputs.clone())
        .filter(|&u| is_forward_compute(graph, u))
        .collect()
}

const INF: u64 = u64::MAX / 8;

/// Whether `v` is a copy of a weight in its compute precision (a cast, a dequantized weight or
/// a ZeRO-3 gather computed from parameters alone;
/// `input_dependent` as [`Graph::input_dependent`] gives it). Policies never choose it:
/// [`choose`] recomputes every weight copy backward reads, once, before its first backward
/// reader.
pub fn is_weight_copy(graph: &Graph, input_dependent: &[bool], v: ValueId) -> bool {
    matches!(
        graph.node(v).op,
        Op::Cast { .. } | Op::Dequantize { .. } | Op::AllGather { .. }
    ) && !input_dependent[v.index()]
}

/// Whether `op` is pointwise, a normalization or moves data without arithmetic
/// ([`Policy::Pointwise`]).
fn is_pointwise(op: &Op) -> bool {
    matches!(
        op,
        Op::Unary(_)
            | Op::Binary(_)
            | Op::Where
            | Op::Clamp(_)
            | Op::Affine { .. }
            | Op::Cast { .. }
            | Op::Reshape { .. }
            | Op::Permute { .. }
            | Op::Slice { .. }
            | Op::BroadcastTo { .. }
            | Op::Norm { .. }
    )
}

/// The min-cut's recomputable ops: every cheap op, and heavy and random ops at `penalty`
/// bytes per FLOP (never when `None`); with `pointwise_only`, pointwise ops alone.
fn min_cut(graph: &Graph, penalty: Option<f64>, pointwise_only: bool) -> BTreeSet<ValueId> {
    let needed = needed(graph);
    let dependent = graph.input_dependent();
    let mut net: DiGraph<(), u64> = DiGraph::new();
    let source = net.add_node(());
    let sink = net.add_node(());
    let mut ends: BTreeMap<ValueId, (NodeIndex, NodeIndex)> = BTreeMap::new();
    for v in graph.values().filter(|&v| is_forward_compute(graph, v)) {
        let node = graph.node(v);
        let (vin, vout) = (net.add_node(()), net.add_node(()));
        net.add_edge(vin, vout, node.ty.bytes().min(INF));
        for u in &node.inputs {
            if let Some(&(_, uout)) = ends.get(u) {
                net.add_edge(uout, vin, INF);
            }
        }
        let recompute_cost = match node.op.class() {
            _ if crosses_block(graph, v) || is_weight_copy(graph, &dependent, v) => INF,
            _ if pointwise_only && !is_pointwise(&node.op) => INF,
            OpClass::Heavy | OpClass::Random => {
                let types: Vec<&TensorType> =
                    node.inputs.iter().map(|&i| &graph.node(i).ty).collect();
                penalty.map_or(INF, |p| {
                    ((flops(&node.op, &types, &node.ty) as f64 * p).ceil() as u64).clamp(1, INF)
                })
            }
            // One byte per cheap op: of two cuts of equal bytes, the one that recomputes
            // fewer ops (fewer launches in backward) wins.
            _ => 1,
        };
        if recompute_cost > 0 {
            net.add_edge(source, vin, recompute_cost);
        }
        if needed.contains(&v) {
            net.add_edge(vout, sink, INF);
        }
        ends.insert(v, (vin, vout));
    }
    let (_, flows) = petgraph::algo::dinics(&net, source, sink);
    let mut reached = vec![false; net.node_count()];
    let mut queue = VecDeque::from([source]);
    reached[source.index()] = true;
    while let Some(n) = queue.pop_front() {
        let forward = net
            .edges_directed(n, petgraph::Direction::Outgoing)
            .filter(|e| flows[e.id().index()] < *e.weight())
            .map(|e| e.target());
        let backward = net
            .edges_directed(n, petgraph::Direction::Incoming)
            .filter(|e| flows[e.id().index()] > 0)
            .map(|e| e.source());
        let next: Vec<NodeIndex> = forward.chain(backward).collect();
        for m in next {
            if !std::mem::replace(&mut reached[m.index()], true) {
                queue.push_back(m);
            }
        }
    }
    ends.into_iter()
        .filter(|(_, (vin, _))| !reached[vin.index()])
        .map(|(v, _)| v)
        .collect()
}

use petgraph::visit::EdgeRef;

fn segments(graph: &Graph, every: usize) -> BTreeSet<ValueId> {
    let every = every.max(1);
    block_values(graph, |_| true, |index| (index + 1).is_multiple_of(every))
}

/// The forward computations (weight copies aside) inside the block instances whose index
/// `recomputed` accepts, but for the values read by another instance or outside blocks in
/// the instances whose index `saves_boundary` accepts.
fn block_values(
    graph: &Graph,
    recomputed: impl Fn(usize) -> bool,
    saves_boundary: impl Fn(usize) -> bool,
) -> BTreeSet<ValueId> {
    let dependent = graph.input_dependent();
    let order = instance_order(graph);
    let chosen = |v: ValueId| {
        let own = instance(&graph.node(v).scope);
        order.get(own).is_some_and(|&index| {
            recomputed(index) && !(saves_boundary(index) && crosses_block(graph, v))
        })
    };
    graph
        .values()
        .filter(|&v| {
            is_forward_compute(graph, v) && chosen(v) && !is_weight_copy(graph, &dependent, v)
        })
        .collect()
}

/// Whether `v` is a softmax, or a cheap or random op reading (`forward`) or feeding (not
/// `forward`) one within its block instance: `marks` holds the answer for values created
/// before (`forward`) or after `v`.
fn near_softmax(graph: &Graph, v: ValueId, marks: &[bool], forward: bool) -> bool {
    let node = graph.node(v);
    if matches!(node.op, Op::Softmax { .. }) {
        return true;
    }
    if !matches!(node.op.class(), OpClass::Cheap | OpClass::Random) {
        return false;
    }
    let own = instance(&node.scope);
    let next = if forward {
        node.inputs.clone()
    } else {
        graph.users(v)
    };
    next.into_iter().any(|n| {
        marks[n.index()]
            && graph.node(n).phase == Phase::Forward
            && instance(&graph.node(n).scope) == own
    })
}

/// The separable attention core: matmuls of two activations whose output reaches a softmax,
/// or that read a softmax's output, through cheap and random ops of their block instance.
fn attention_core(graph: &Graph, dependent: &[bool]) -> BTreeSet<ValueId> {
    let values: Vec<ValueId> = graph.values().collect();
    let mut after = vec![false; graph.len()];
    for &v in &values {
        after[v.index()] = near_softmax(graph, v, &after, true);
    }
    let mut before = vec![false; graph.len()];
    for &v in values.iter().rev() {
        before[v.index()] = near_softmax(graph, v, &before, false);
    }
    values
        .into_iter()
        .filter(|&v| {
            let node = graph.node(v);
            let own = instance(&node.scope);
            let inside = |n: &ValueId| instance(&graph.node(*n).scope) == own;
            matches!(node.op, Op::MatMul { .. })
                && node.inputs.iter().all(|i| dependent[i.index()])
                && (node.inputs.iter().any(|i| after[i.index()] && inside(i))
                    || graph
                        .users(v)
                        .iter()
                        .any(|u| before[u.index()] && inside(u)))
        })
        .collect()
}

fn selective(graph: &Graph) -> BTreeSet<ValueId> {
    let dependent = graph.input_dependent();
    let core = attention_core(graph, &dependent);
    graph
        .values()
        .filter(|&v| {
            let node = graph.node(v);
            is_forward_compute(graph, v)
                && !instance(&node.scope).is_empty()
                && !crosses_block(graph, v)
                && !is_weight_copy(graph, &dependent, v)
                && (matches!(node.op.class(), OpClass::Cheap | OpClass::Random)
                    || core.contains(&v))
        })
        .collect()
}

/// Casts that widen a low-precision (bf16, fp16) value computed from a step input to fp32.
/// Such a cast is exact, so recomputing it from its saved input gives the same bits at half
/// the saved bytes, for one cast kernel.
pub fn widening_casts(graph: &Graph) -> BTreeSet<ValueId> {
    let dependent = graph.input_dependent();
    graph
        .values()
        .filter(|&v| {
            let node = graph.node(v);
            node.phase == Phase::Forward
                && matches!(node.op, Op::Cast { to: DType::F32 })
                && node.inputs.iter().all(|&i| {
                    dependent[i.index()]
                        && matches!(graph.node(i).ty.dtype, DType::BF16 | DType::F16)
                })
        })
        .collect()
}

/// Low-precision copies of parameters that forward computes ([`is_weight_copy`]). Backward
/// recomputes them from the parameters (the same bits) instead of keeping them from forward.
pub fn weight_copies(graph: &Graph) -> BTreeSet<ValueId> {
    let dependent = graph.input_dependent();
    graph
        .values()
        .filter(|&v| graph.node(v).phase == Phase::Forward && is_weight_copy(graph, &dependent, v))
        .collect()
}

/// The segment length of Chen et al.'s sqrt(n) checkpointing: round(sqrt(top-level block
/// instances)), at least 1.
pub fn sqrt_segment(graph: &Graph) -> usize {
    ((instance_order(graph).len() as f64).sqrt().round() as usize).max(1)
}

/// The number of top-level block instances (`repeat` copies and block calls).
pub fn instances(graph: &Graph) -> usize {
    instance_order(graph).len()
}

/// The forward values `policy` recomputes, widening casts of activations and weight copies
/// always among them (a superset of what the rewrite clones: only values some backward node
/// needs, directly or through another recomputed value, are).
pub fn choose(graph: &Graph, policy: Policy) -> BTreeSet<ValueId> {
    let mut chosen = match policy {
        Policy::KeepAll => BTreeSet::new(),
        Policy::MinCut { penalty } => min_cut(graph, penalty, false),
        Policy::Pointwise => min_cut(graph, None, true),
        Policy::Segments { every } => segments(graph, every),
        Policy::FirstBlocks { count } => {
            let mut chosen = block_values(graph, |index| index < count, |_| true);
            chosen.extend(min_cut(graph, None, true));
            chosen
        }
        Policy::Selective => selective(graph),
        Policy::Knapsack { saving } => knapsack::choose(graph, saving),
    };
    chosen.extend(widening_casts(graph));
    chosen.extend(weight_copies(graph));
    chosen
}

/// The graph with recomputation, and the original of every clone it made.
#[derive(Debug, Clone)]
pub struct Rewritten {
    pub graph: Graph,
    /// `(original forward value, its clone in the new graph)`, in creation order.
    pub clones: Vec<(ValueId, ValueId)>,
}

struct Rebuild<'a> {
    old: &'a Graph,
    new: Graph,
    map: Vec<Option<ValueId>>,
    clone_of: BTreeMap<ValueId, ValueId>,
    clones: Vec<(ValueId, ValueId)>,
    recompute: &'a BTreeSet<ValueId>,
}

impl Rebuild<'_> {
    fn copy(
        &mut self,
        v: ValueId,
        inputs: Vec<ValueId>,
        phase: Phase,
    ) -> Result<ValueId, StageError> {
        let node = self.old.node(v);
        let origin = Origin {
            span: node.span,
            scope: node.scope.clone(),
            phase,
        };
        self.new
            .add(node.op.clone(), inputs, &origin)
            .map_err(|e| StageError::internal("checkpoint", format!("{v}: {}", e.message)))
    }

    fn mapped(&self, v: ValueId) -> Result<ValueId, StageError> {
        self.map[v.index()].ok_or_else(|| {
            StageError::internal("checkpoint", format!("{v} used before it was rebuilt"))
        })
    }

    /// The value backward should read for `v`: its clone when recomputed, else itself.
    fn for_backward(&mut self, v: ValueId) -> Result<ValueId, StageError> {
        if !self.recompute.contains(&v) {
            return self.mapped(v);
        }
        if let Some(&c) = self.clone_of.get(&v) {
            return Ok(c);
        }
        let inputs = self.old.node(v).inputs.clone();
        let mut mapped = Vec::with_capacity(inputs.len());
        for i in inputs {
            mapped.push(self.for_backward(i)?);
        }
        let c = self.copy(v, mapped, Phase::Backward)?;
        self.clone_of.insert(v, c);
        self.clones.push((v, c));
        Ok(c)
    }
}

/// Rebuilds `graph` so that backward reads clones of the values in `recompute`, each made
/// just before its first backward reader. Creation order stays topological.
pub fn rewrite(graph: &Graph, recompute: &BTreeSet<ValueId>) -> Result<Rewritten, StageError> {
    let mut r = Rebuild {
        old: graph,
        new: Graph::new(),
        map: vec![None; graph.len()],
        clone_of: BTreeMap::new(),
        clones: Vec::new(),
        recompute,
    };
    for v in graph.values() {
        let node = graph.node(v);
        let mut inputs = Vec::with_capacity(node.inputs.len());
        for &i in &node.inputs {
            inputs.push(if node.phase == Phase::Forward {
                r.mapped(i)?
            } else {
                r.for_backward(i)?
            });
        }
        let id = r.copy(v, inputs, node.phase)?;
        r.map[v.index()] = Some(id);
    }
    for (name, v) in &graph.outputs {
        let id = r.mapped(*v)?;
        r.new.outputs.push((name.clone(), id));
    }
    Ok(Rewritten {
        graph: r.new,
        clones: r.clones,
    })
}
