//! Text dump of a graph, one node per line: `%3 = matmul{ta=false, tb=false}(%1, %2) : f32[8, 4]`.

use super::{Graph, Op};
use std::fmt::Write;

/// The op's attributes as `k=v` pairs, from its serde form so every variant prints.
fn attributes(op: &Op) -> String {
    let mut parts = Vec::new();
    if let Ok(serde_json::Value::Object(map)) = serde_json::to_value(op) {
        for (k, v) in map {
            if k == "op" {
                continue;
            }
            parts.push(format!("{k}={v}"));
        }
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(", "))
    }
}

/// Renders the whole graph, then its outputs.
pub fn print(graph: &Graph) -> String {
    let mut out = String::new();
    for v in graph.values() {
        let node = graph.node(v);
        let inputs: Vec<String> = node.inputs.iter().map(|i| i.to_string()).collect();
        let scope = if node.scope.is_empty() {
            String::new()
        } else {
            format!("  # {}", node.scope)
        };
        let _ = writeln!(
            out,
            "{v} = {}{}({}) : {}{scope}",
            node.op.name(),
            attributes(&node.op),
            inputs.join(", "),
            node.ty
        );
    }
    for (name, v) in &graph.outputs {
        let _ = writeln!(out, "output {name} = {v}");
    }
    out
}
