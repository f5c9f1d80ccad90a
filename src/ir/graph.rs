//! The data-flow graph: nodes are ops, each producing one value; stored on petgraph.

use super::infer::{infer, TypeError};
use super::{Op, Span, TensorType};
use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::Direction;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The largest tensor memc plans (1 PiB), so byte sums over a step cannot overflow.
pub const MAX_TENSOR_BYTES: u64 = 1 << 50;

/// The value a node produces; its `Display` (`%12`) matches the text dumps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ValueId(pub u32);

impl ValueId {
    /// Position in the graph's node list (also its creation order).
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// Which part of the training step a node belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Forward,
    Backward,
    Update,
}

/// One op application with its inferred output type and its origin in the source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub op: Op,
    pub inputs: Vec<ValueId>,
    pub ty: TensorType,
    pub span: Span,
    /// Dotted path of the block instance that created the node (`layer.3`), empty at top level.
    pub scope: String,
    pub phase: Phase,
}

impl Node {
    /// This node's source span, block scope and phase, for a node made in its place.
    pub fn origin(&self) -> Origin {
        Origin {
            span: self.span,
            scope: self.scope.clone(),
            phase: self.phase,
        }
    }
}

/// Where new nodes come from: their source span, block scope and phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub span: Span,
    pub scope: String,
    pub phase: Phase,
}

/// A graph of single-output nodes. Nodes can only be appended, and only with inputs that
/// already exist, so **creation order is a topological order**; every node's type is the
/// result of [`infer`] on its inputs' types.
#[derive(Debug, Clone, Default)]
pub struct Graph {
    dag: DiGraph<Node, u32>,
    /// Named results of the step: the loss for training, graph outputs for inference.
    pub outputs: Vec<(String, ValueId)>,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph::default()
    }

    /// Appends `op` applied to `inputs`, inferring its type; fails without changing the graph
    /// when the inputs do not fit the op.
    pub fn add(
        &mut self,
        op: Op,
        inputs: Vec<ValueId>,
        origin: &Origin,
    ) -> Result<ValueId, TypeError> {
        let types: Vec<&TensorType> = inputs.iter().map(|&v| &self.node(v).ty).collect();
        let ty = infer(&op, &types)?;
        if ty.bytes() > MAX_TENSOR_BYTES {
            return Err(TypeError {
                message: match ty.numel() {
                    u64::MAX => format!("tensor {ty} is too large (more than 2^64 elements)"),
                    n => format!("tensor {ty} is too large ({n} elements)"),
                },
                help: "tensors are limited to 2^50 bytes (1 PiB): check the dims".into(),
            });
        }
        let node = Node {
            op,
            inputs: inputs.clone(),
            ty,
            span: origin.span,
            scope: origin.scope.clone(),
            phase: origin.phase,
        };
        let idx = self.dag.add_node(node);
        for (slot, v) in inputs.iter().enumerate() {
            self.dag
                .add_edge(NodeIndex::new(v.index()), idx, slot as u32);
        }
        Ok(ValueId(idx.index() as u32))
    }

    /// The node producing `v`. Ids come from this graph, so the lookup cannot fail.
    pub fn node(&self, v: ValueId) -> &Node {
        &self.dag[NodeIndex::new(v.index())]
    }

    /// Marks the parameters whose names `frozen` accepts as frozen (types and edges are
    /// unchanged, so the graph stays valid).
    pub fn freeze_params(&mut self, frozen: impl Fn(&str) -> bool) {
        for node in self.dag.node_weights_mut() {
            if let Op::Param {
                name, frozen: flag, ..
            } = &mut node.op
            {
                *flag |= frozen(name);
            }
        }
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.dag.node_count()
    }

    /// True when the graph has no nodes.
    pub fn is_empty(&self) -> bool {
        self.dag.node_count() == 0
    }

    /// All values in creation (topological) order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = ValueId> + ExactSizeIterator {
        (0..self.len() as u32).map(ValueId)
    }

    /// Distinct nodes that read `v`, in creation order.
    pub fn users(&self, v: ValueId) -> Vec<ValueId> {
        let mut users: Vec<ValueId> = self
            .dag
            .neighbors_directed(NodeIndex::new(v.index()), Direction::Outgoing)
            .map(|n| ValueId(n.index() as u32))
            .collect();
        users.sort();
        users.dedup();
        users
    }

    /// Parameters in creation order.
    pub fn params(&self) -> Vec<ValueId> {
        self.values()
            .filter(|&v| matches!(self.node(v).op, Op::Param { .. }))
            .collect()
    }

    /// For each value (by index), whether it depends on a step input (or on a value a
    /// pipeline stage receives, computed from one); values that do not are computed from
    /// parameters and constants alone.
    pub fn input_dependent(&self) -> Vec<bool> {
        let mut dependent = vec![false; self.len()];
        for v in self.values() {
            let node = self.node(v);
            dependent[v.index()] = matches!(node.op, Op::Input { .. } | Op::PipelineRecv { .. })
                || node.inputs.iter().any(|i| dependent[i.index()]);
        }
        dependent
    }

    /// The value named `name` among the outputs.
    pub fn output(&self, name: &str) -> Option<ValueId> {
        self.outputs
            .iter()
            .find(|(n, _)| n == name)
            .map(|&(_, v)| v)
    }

    /// True when petgraph finds a cycle (never, for graphs built by [`Graph::add`]).
    pub fn has_cycle(&self) -> bool {
        petgraph::algo::is_cyclic_directed(&self.dag)
    }

    /// Edges as (producer, consumer) pairs, for analyses that build their own networks.
    pub fn edges(&self) -> impl Iterator<Item = (ValueId, ValueId)> + '_ {
        self.dag.raw_edges().iter().map(|e| {
            (
                ValueId(e.source().index() as u32),
                ValueId(e.target().index() as u32),
            )
        })
    }
}
