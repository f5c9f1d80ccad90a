//! The graph verifier run between passes: every input defined before use, every type equal
//! to what inference gives, no cycle, every named output present.

use super::infer::infer;
use super::{Graph, TensorType, ValueId};
use std::fmt;

/// One broken invariant, naming the entity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyError {
    pub value: Option<ValueId>,
    pub message: String,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.value {
            Some(v) => write!(f, "{v}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// Checks the graph's invariants and returns every violation found.
pub fn verify(graph: &Graph) -> Result<(), Vec<VerifyError>> {
    let mut errors = Vec::new();
    let mut err =
        |value: Option<ValueId>, message: String| errors.push(VerifyError { value, message });
    for v in graph.values() {
        let node = graph.node(v);
        if let Some(bad) = node.inputs.iter().find(|i| **i >= v) {
            err(
                Some(v),
                format!("input {bad} is not defined before its use"),
            );
            continue;
        }
        let types: Vec<&TensorType> = node.inputs.iter().map(|&i| &graph.node(i).ty).collect();
        match infer(&node.op, &types) {
            Ok(ty) if ty == node.ty => {}
            Ok(ty) => err(
                Some(v),
                format!("recorded type {} but inference gives {ty}", node.ty),
            ),
            Err(e) => err(
                Some(v),
                format!("ill-typed {}: {}", node.op.name(), e.message),
            ),
        }
    }
    if graph.has_cycle() {
        err(None, "the graph has a cycle".into());
    }
    for (name, v) in &graph.outputs {
        if v.index() >= graph.len() {
            err(Some(*v), format!("output `{name}` names a missing value"));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}
