//! Which stage each forward value runs on: the top-level block instances (`layer.3`) in
//! creation order, instance `i` of `L` on stage `i * P / L` (contiguous runs, as equal in
//! blocks as `P` allows: the repeated blocks of a model are alike, so this balances their
//! parameter bytes and ops); a value outside blocks on the latest stage of its inputs (the
//! embedding on stage 0, the final norm and loss head after the last block on the last);
//! a block's value never on a stage before its inputs'; a parameter on the first stage
//! that reads it (a tied embedding on stage 0, sent to the last stage with each
//! micro-batch, its gradient sent back).

use super::SplitError;
use crate::diagnostic::UserError;
use crate::ir::{Graph, Op};
use crate::passes::checkpoint::instance;
use std::collections::BTreeMap;

/// The stage of every value (by index) of a forward graph.
pub(super) type Assignment = Vec<u32>;

/// Assigns every value of `graph` to one of `stages` stages. Refused when the model has
/// fewer block instances than stages, or a batch norm with running statistics (which
/// would see one micro-batch at a time).
pub(super) fn assign(graph: &Graph, stages: u32) -> Result<Assignment, SplitError> {
    let mut order: BTreeMap<&str, usize> = BTreeMap::new();
    for v in graph.values() {
        let own = instance(&graph.node(v).scope);
        if !own.is_empty() && !order.contains_key(own) {
            order.insert(own, order.len());
        }
    }
    if let Some(bn) = graph
        .params()
        .into_iter()
        .find(|&p| matches!(graph.node(p).op, Op::Param { buffer: true, .. }))
    {
        return Err(SplitError::User(UserError::at(
            graph.node(bn).span,
            "a pipeline normalizes each micro-batch alone, and this batch norm trains on the \
             statistics of the whole batch",
            "batch norm with running statistics",
            "plan data parallelism without a pipeline, or normalize per sample (layernorm, \
             groupnorm)",
        )));
    }
    let blocks = order.len();
    if blocks < stages as usize {
        return Err(SplitError::User(UserError::general(
            format!(
                "pipeline = {stages} cuts the model's blocks into {stages} stages, and it has \
                 {blocks} block instance(s)"
            ),
            format!(
                "plan at most {} stage(s), one or more blocks each (`repeat L block(x)` \
                 makes L instances)",
                blocks.max(1)
            ),
        )));
    }
    let mut stage = vec![0u32; graph.len()];
    for v in graph.values() {
        let node = graph.node(v);
        let after_inputs = node.inputs.iter().map(|i| stage[i.index()]).max();
        let own = order
            .get(instance(&node.scope))
            .map(|&i| (i * stages as usize / blocks) as u32);
        stage[v.index()] = own.max(after_inputs).unwrap_or(0);
    }
    for p in graph.params() {
        // A parameter lives on the first stage that reads it; the others receive it.
        let readers = graph.users(p).into_iter().map(|u| stage[u.index()]);
        stage[p.index()] = readers.min().unwrap_or(stage[p.index()]);
    }
    Ok(stage)
}
