//! The class of each value's buffer (parameter, gradient, optimizer state, input,
//! activation, temporary), and which values are views of another's bytes.

use super::tier::on_device;
use super::{views, BufferClass};
use crate::ir::{Graph, Op, ValueId};
use std::collections::BTreeMap;

/// The gradient each updated parameter's update reads, by parameter (they get class
/// `Gradient`).
pub(super) fn gradient_values(graph: &Graph) -> BTreeMap<ValueId, ValueId> {
    use crate::passes::partition::{reduced_gradient, updated_param};
    graph
        .values()
        .flat_map(|v| {
            let node = graph.node(v);
            crate::ops::optimizer::stepped(&node.op, &node.inputs)
                .into_iter()
                .map(|(p, g, _)| {
                    let [p, g] = [p, g].map(|x| on_device(graph, x));
                    (updated_param(graph, p), reduced_gradient(graph, g))
                })
        })
        .collect()
}

/// The values that are parameter gradients.
pub type Gradients = std::collections::BTreeSet<ValueId>;

/// The parameter gradients of `graph`.
pub fn gradients(graph: &Graph) -> Gradients {
    gradient_values(graph).into_values().collect()
}

pub(super) fn class_of(graph: &Graph, v: ValueId, grads: &Gradients) -> BufferClass {
    match graph.node(v).op {
        // Gradient accumulators are persistent state read by the updates.
        _ if grads.contains(&v) => BufferClass::Gradient,
        Op::Param { .. } => BufferClass::Param,
        Op::OptimState { .. } => BufferClass::OptimState,
        Op::Input { .. } => BufferClass::Input,
        _ if graph.node(v).phase == crate::ir::Phase::Forward => BufferClass::Activation,
        _ => BufferClass::Temporary,
    }
}

/// The value each view aliases (None for a value with bytes of its own), by value index;
/// `grads` are the graph's [`gradients`].
pub(super) fn view_roots(graph: &Graph, grads: &Gradients) -> Vec<Option<ValueId>> {
    views::roots(graph, |v| class_of(graph, v, grads))
}
