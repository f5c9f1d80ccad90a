//! Where each buffer comes from, in the model's own words: its role in the step (parameter,
//! gradient of `w`, Adam moment of `w`, activation saved for backward, recomputed copy,
//! workspace, ...) and the `.mdl` line its value belongs to.

use super::peak::line_of;
use super::{Buffer, BufferClass, Plan, Step};
use crate::ir::{Graph, Op, Phase, Span, ValueId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// A buffer's part in the step. Backward and update values keep the source span of the
/// forward expression they belong to, so a role together with [`Buffer::line`] reads as
/// "gradient of `wte`, line 6" or "activation saved for the backward of line 19".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Role {
    /// A parameter of the model (frozen or trained).
    Parameter,
    /// Model state that is not a parameter: a batch norm's running mean or variance.
    RunningStatistic,
    /// A tensor bound per step from outside.
    Input,
    /// One of AdamW's moments (or their 8-bit scales) of parameter `of`.
    AdamMoment { of: String },
    /// SGD's momentum buffer of parameter `of`.
    Momentum { of: String },
    /// This rank's shard of the fp32 master weights of 16-bit parameter `of` (ZeRO-1 and 2
    /// with mixed precision): what its update writes.
    MasterWeights { of: String },
    /// Persistent state no single parameter owns: the fp16 loss scale and its counter.
    LossScale,
    /// The complete gradient of parameter `of` (its accumulator under accumulation).
    Gradient { of: String },
    /// A forward value that a backward step reads: kept from forward to backward.
    SavedActivation,
    /// A forward value that no backward step reads: freed within forward.
    Activation,
    /// A forward value that checkpointing computes again in backward instead of saving.
    Recomputed,
    /// A backward value that is not a parameter's complete gradient.
    BackwardTemporary,
    /// A value of the optimizer step (clip coefficient, unscaled gradient, ...).
    UpdateTemporary,
    /// Scratch of one step of op `op`.
    Workspace { op: String },
}

impl Role {
    /// The role in a person's words, naming `line` (the buffer's `.mdl` line) where the
    /// role refers to it: "activation saved for the backward of line 19".
    pub fn describe(&self, line: Option<usize>) -> String {
        let of_line = |what: &str| match line {
            Some(n) => format!("{what} of line {n}"),
            None => what.to_string(),
        };
        match self {
            Role::Parameter => "parameter".into(),
            Role::RunningStatistic => "batch norm running statistic".into(),
            Role::Input => "input".into(),
            Role::AdamMoment { of } => format!("Adam moment of `{of}`"),
            Role::Momentum { of } => format!("SGD momentum of `{of}`"),
            Role::MasterWeights { of } => format!("fp32 master weights of `{of}` (a shard)"),
            Role::LossScale => "loss-scale state".into(),
            Role::Gradient { of } => format!("gradient of `{of}`"),
            Role::SavedActivation => of_line("activation saved for the backward"),
            Role::Activation => of_line("activation (not saved for backward)"),
            Role::Recomputed => of_line("recomputed copy (checkpointing)"),
            Role::BackwardTemporary => of_line("backward temporary"),
            Role::UpdateTemporary => of_line("optimizer-step temporary"),
            Role::Workspace { op } => of_line(&format!("workspace of {op}")),
        }
    }
}

/// Which buffers hold forward activations that a backward or update step reads (a view's
/// reader marks its root), by buffer index.
pub(super) fn saved_for_backward(buffers: &[Buffer], steps: &[Step]) -> Vec<bool> {
    let mut saved = vec![false; buffers.len()];
    for s in steps.iter().filter(|s| s.phase != Phase::Forward) {
        for &b in &s.inputs {
            let b = buffers[b.index()].view_of.unwrap_or(b);
            saved[b.index()] |= buffers[b.index()].class == BufferClass::Activation;
        }
    }
    saved
}

/// The parameter each gradient and optimizer-state input of an update belongs to, with the
/// update's op; an fp32 master shard the update writes maps to its parameter with the
/// update `None`.
fn state_owners(graph: &Graph) -> BTreeMap<ValueId, (Option<&Op>, ValueId)> {
    use crate::passes::partition::{reduced_gradient, updated_param};
    let mut owners = BTreeMap::new();
    for v in graph.values() {
        let node = graph.node(v);
        for (target, grad, rest) in crate::ops::optimizer::stepped(&node.op, &node.inputs) {
            let param = updated_param(graph, target);
            for &s in rest {
                if let Op::OptimState { .. } = graph.node(s).op {
                    owners.insert(s, (Some(&node.op), param));
                }
            }
            if let Op::OptimState { .. } = graph.node(target).op {
                owners.insert(target, (None, param));
            }
            owners.insert(grad, (Some(&node.op), param));
            owners.insert(reduced_gradient(graph, grad), (Some(&node.op), param));
        }
    }
    owners
}

/// The name of parameter `p`, empty when `p` is not one.
fn param_name(graph: &Graph, p: ValueId) -> String {
    match &graph.node(p).op {
        Op::Param { name, .. } => name.clone(),
        _ => String::new(),
    }
}

/// Sets every buffer's role (buffer `i < values.len()` holds `values[i]`; the rest are the
/// steps' workspaces) and gives a parameter's gradient and optimizer state without a span
/// of their own the parameter's. `recomputed` lists checkpointing's clones.
pub(super) fn assign(
    graph: &Graph,
    buffers: &mut [Buffer],
    values: &[ValueId],
    steps: &[Step],
    recomputed: &BTreeSet<ValueId>,
) {
    let saved = saved_for_backward(buffers, steps);
    let owners = state_owners(graph);
    for (i, &v) in values.iter().enumerate() {
        let node = graph.node(v);
        let owner = owners.get(&v).copied();
        let b = &mut buffers[i];
        if b.span.is_none() {
            b.span = owner.and_then(|(_, p)| nonempty(graph.node(p).span));
        }
        let owner = owner.map(|(op, p)| (op, param_name(graph, p)));
        b.role = Some(match (&node.op, b.class, owner) {
            (_, BufferClass::Gradient, Some((_, of))) => Role::Gradient { of },
            (Op::OptimState { .. }, _, Some((None, of))) => Role::MasterWeights { of },
            (Op::OptimState { .. }, _, Some((Some(Op::AdamW(_) | Op::AdamWGroup { .. }), of))) => {
                Role::AdamMoment { of }
            }
            (Op::OptimState { .. }, _, Some((_, of))) => Role::Momentum { of },
            (Op::OptimState { .. }, _, None) => Role::LossScale,
            (Op::Param { buffer: true, .. }, _, _) => Role::RunningStatistic,
            (_, BufferClass::Param, _) => Role::Parameter,
            (_, BufferClass::Input, _) => Role::Input,
            _ if saved[i] => Role::SavedActivation,
            (_, BufferClass::Activation, _) => Role::Activation,
            _ if recomputed.contains(&v) => Role::Recomputed,
            _ if node.phase == Phase::Update => Role::UpdateTemporary,
            _ => Role::BackwardTemporary,
        });
    }
    for s in steps {
        if let Some(w) = s.workspace {
            buffers[w.index()].role = Some(Role::Workspace {
                op: s.op.name().to_string(),
            });
        }
    }
}

/// A node's span, unless it is empty (a node the compiler made with no source of its own).
pub(super) fn nonempty(span: Span) -> Option<Span> {
    (span.end > span.start).then_some(span)
}

/// Gives every buffer with a span inside `source` its 1-based line ([`Buffer::line`]) and
/// records each such line's trimmed text once in [`Plan::source_lines`].
pub fn attach_lines(plan: &mut Plan, source: &str) {
    for b in &mut plan.buffers {
        let Some((n, text)) = b.span.and_then(|s| line_of(source, s)) else {
            continue;
        };
        b.line = Some(n);
        plan.source_lines
            .entry(n)
            .or_insert_with(|| text.to_string());
    }
}

impl Buffer {
    /// What the buffer holds in a person's words: its [`Role`] described with its line
    /// ("gradient of `wte`", "activation saved for the backward of line 19"), a parameter
    /// or input with its name ("parameter `wte`"), the class label when no role is recorded.
    pub fn describe(&self) -> String {
        holding(self.role.as_ref(), &self.name, self.class, self.line)
    }
}

/// What a buffer named `name` of `class` holds, in a person's words: its role described with
/// `line` where the role refers to it, a parameter or input with its name, the class label
/// when no role is recorded.
pub(super) fn holding(
    role: Option<&Role>,
    name: &str,
    class: BufferClass,
    line: Option<usize>,
) -> String {
    match role {
        Some(Role::Parameter) => format!("parameter `{name}`"),
        Some(Role::RunningStatistic) => format!("running statistic `{name}`"),
        Some(Role::Input) => format!("input `{name}`"),
        Some(r) => r.describe(line),
        None => class.label().to_string(),
    }
}

impl Plan {
    /// The bytes and the number of the buffers `keep` selects (views never count), by
    /// `.mdl` line (None for buffers without one): most bytes first, then by line.
    pub fn bytes_by_line(
        &self,
        keep: impl Fn(&Buffer) -> bool,
    ) -> Vec<(Option<usize>, u64, usize)> {
        let mut by_line: BTreeMap<Option<usize>, (u64, usize)> = BTreeMap::new();
        for b in self
            .buffers
            .iter()
            .filter(|b| b.view_of.is_none() && keep(b))
        {
            let e = by_line.entry(b.line).or_default();
            e.0 += b.bytes;
            e.1 += 1;
        }
        let mut rows: Vec<(Option<usize>, u64, usize)> = (by_line.into_iter())
            .map(|(line, (bytes, count))| (line, bytes, count))
            .collect();
        rows.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        rows
    }
}
