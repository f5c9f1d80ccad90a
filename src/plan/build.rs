//! Graph + schedule to Plan: buffers from lifetimes, offsets from the arena layout, steps
//! with FLOPs, and the memory report.

use super::classes::{class_of, gradient_values, view_roots, Gradients};
use super::live::{peak_of, scheduled};
use super::report::{live_bytes, Bytes, PhasePeak, PrecisionSummary, Report, SavedKind};
use super::tier::{on_device, tier_of};
use super::*;
use super::{origin, views};
use crate::ir::cost::flops;
use crate::ir::{Graph, Op, Phase, ValueId};
use crate::passes::arena::{self, LayoutOptions};
use crate::passes::liveness::{self, Interval};
use crate::passes::schedule::{self, Schedule};
use crate::passes::StageError;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Choices the plan builder makes.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// Run each parameter's update as soon as its gradient is complete.
    pub optimizer_in_backward: bool,
    /// Time cap of the arena layout search.
    pub layout_time: Duration,
    /// Alignment of every buffer offset (the target's [`Target::alignment`] for a backend).
    pub alignment: u64,
    /// A pipeline stage's place in the 1F1B schedule (None without a pipeline).
    pub pipeline: Option<crate::passes::pipeline::order::OneFOneB>,
}

/// The bytes of parameter gradients that are views of a buffer of another class (members
/// of a merged op's output, `views::roots`), which the sums over roots leave out.
fn gradient_members(buffers: &[Buffer]) -> u64 {
    let class = |b: BufferId| buffers.get(b.index()).map(|r| r.class);
    (buffers.iter())
        .filter(|b| b.class == BufferClass::Gradient && b.tier.is_device())
        .filter(|b| {
            b.view_of
                .is_some_and(|r| class(r) != Some(BufferClass::Gradient))
        })
        .map(|b| b.bytes)
        .sum()
}

fn name_of(
    graph: &Graph,
    v: ValueId,
    class: BufferClass,
    grad_of: &BTreeMap<ValueId, String>,
) -> String {
    let node = graph.node(v);
    match &node.op {
        Op::Param { name, .. } | Op::OptimState { name, .. } | Op::Input { name, .. } => {
            name.clone()
        }
        Op::CopyToHost => {
            let (i, grad) = (node.inputs[0], BufferClass::Gradient);
            let class = [BufferClass::Temporary, grad][usize::from(grad_of.contains_key(&i))];
            format!("host.{}", name_of(graph, i, class, grad_of))
        }
        _ if class == BufferClass::Gradient => {
            format!("grad.{}", grad_of.get(&v).cloned().unwrap_or_default())
        }
        op if node.scope.is_empty() => format!("{}{v}", op.name()),
        op => format!("{}/{}{v}", node.scope, op.name()),
    }
}

/// Builds the plan of `graph` (forward, or forward + backward + update) for the CPU, with
/// nothing recomputed.
pub fn build(
    model: &str,
    graph: &Graph,
    train: Option<&TrainSummary>,
    options: &BuildOptions,
) -> Result<Plan, StageError> {
    build_for(Target::Cpu, model, graph, train, options, &BTreeSet::new())
}

/// The buffers of a graph: one per live value with bytes, and which value each holds.
struct Buffers {
    buffers: Vec<Buffer>,
    /// The buffer of each value (by value index), if it has one.
    of: Vec<Option<BufferId>>,
    /// The value of each value buffer (workspace buffers come after these).
    values: Vec<ValueId>,
}

impl Buffers {
    fn new(graph: &Graph, own_lives: &[Option<Interval>]) -> Buffers {
        let by_param = gradient_values(graph);
        let grads: Gradients = by_param.values().copied().collect();
        let roots = view_roots(graph, &grads);
        let view_offsets = views::offsets(graph, &roots);
        let mut lives = own_lives.to_vec();
        views::extend_roots(&mut lives, &roots);
        let mut grad_of = BTreeMap::new();
        for (p, g) in by_param {
            if let Op::Param { name, .. } = &graph.node(p).op {
                grad_of.insert(g, name.clone());
            }
        }
        let mut out = Buffers {
            buffers: Vec::new(),
            of: vec![None; graph.len()],
            values: Vec::new(),
        };
        for v in graph.values() {
            let Some(Interval { first, last }) = lives[v.index()] else {
                continue;
            };
            let ty = graph.node(v).ty.clone();
            if ty.bytes() == 0 {
                continue;
            }
            let class = class_of(graph, v, &grads);
            let id = BufferId(out.buffers.len() as u32);
            out.of[v.index()] = Some(id);
            out.values.push(v);
            out.buffers.push(Buffer {
                id,
                name: name_of(graph, v, class, &grad_of),
                bytes: ty.bytes(),
                ty,
                offset: 0,
                first,
                last,
                class,
                tier: tier_of(graph, v),
                view_of: roots[v.index()].and_then(|r| out.of[r.index()]),
                view_offset: view_offsets[v.index()],
                span: origin::nonempty(graph.node(v).span),
                role: None,
                line: None,
            });
        }
        out
    }

    /// The steps of `sched`, adding a workspace buffer for each step that needs scratch
    /// on `target`.
    fn steps(
        &mut self,
        target: Target,
        graph: &Graph,
        sched: &Schedule,
    ) -> Result<Vec<Step>, StageError> {
        let missing = |v: ValueId| StageError::internal("plan", format!("{v} has no buffer"));
        let mut steps = Vec::with_capacity(sched.order.len());
        for (s, &v) in sched.order.iter().enumerate() {
            let node = graph.node(v);
            let in_types: Vec<&crate::ir::TensorType> =
                node.inputs.iter().map(|&i| &graph.node(i).ty).collect();
            let inputs = node
                .inputs
                .iter()
                .map(|&i| self.of[i.index()].ok_or_else(|| missing(i)))
                .collect::<Result<Vec<_>, _>>()?;
            let ws = target.workspace_bytes(&node.op, &in_types, &node.ty);
            let workspace = (ws > 0).then(|| {
                let id = BufferId(self.buffers.len() as u32);
                let ty = crate::ir::TensorType::new(crate::ir::DType::F32, vec![(ws / 4) as usize]);
                self.buffers.push(Buffer {
                    id,
                    name: format!("workspace.{}{v}", node.op.name()),
                    ty,
                    bytes: ws,
                    offset: 0,
                    first: s,
                    last: s,
                    class: BufferClass::Workspace,
                    tier: tier_of(graph, v),
                    view_of: None,
                    view_offset: 0,
                    span: origin::nonempty(node.span),
                    role: None,
                    line: None,
                });
                id
            });
            steps.push(Step {
                op: node.op.clone(),
                inputs,
                output: self.of[v.index()],
                workspace,
                flops: flops(&node.op, &in_types, &node.ty),
                phase: node.phase,
                scope: node.scope.clone(),
            });
        }
        Ok(steps)
    }

    /// Every parameter with its initializer and gradient buffer.
    fn params(&self, graph: &Graph) -> Vec<ParamBinding> {
        let grads = gradient_values(graph);
        graph
            .params()
            .into_iter()
            .filter_map(|p| {
                let Op::Param {
                    name,
                    init,
                    buffer: running_statistic,
                    ..
                } = &graph.node(p).op
                else {
                    return None;
                };
                let grad = grads.get(&p).and_then(|g| self.of[g.index()]);
                self.of[p.index()].map(|buffer| ParamBinding {
                    name: name.clone(),
                    buffer,
                    init: *init,
                    grad,
                    quant: crate::passes::quantize::packing(graph, p),
                    shard_of: crate::passes::partition::full_shape(graph, p),
                    master: crate::passes::partition::master_of(graph, p)
                        .and_then(|m| self.of[m.index()]),
                    running_statistic: *running_statistic,
                    tensor_split: None,
                })
            })
            .collect()
    }

    /// Every input with its id bound.
    fn inputs(&self, graph: &Graph) -> Vec<InputBinding> {
        graph
            .values()
            .filter_map(|v| match &graph.node(v).op {
                Op::Input { name, .. } => self.of[v.index()].map(|buffer| InputBinding {
                    name: name.clone(),
                    buffer,
                    id_limit: inputs::id_limit(graph, v),
                    id_ignored: inputs::id_ignored(graph, v),
                    key_mask: inputs::only_key_mask(graph, v),
                }),
                _ => None,
            })
            .collect()
    }

    /// Every named output of the graph that has a buffer.
    fn outputs(&self, graph: &Graph) -> Vec<(String, BufferId)> {
        graph
            .outputs
            .iter()
            .filter_map(|(n, v)| self.of[v.index()].map(|b| (n.clone(), b)))
            .collect()
    }

    /// Every optimizer-state buffer with its initial value.
    fn optim_state(&self, graph: &Graph) -> Vec<StateBinding> {
        self.buffers
            .iter()
            .zip(&self.values)
            .filter_map(|(b, &v)| match graph.node(v).op {
                Op::OptimState { init, .. } => Some(StateBinding { buffer: b.id, init }),
                _ => None,
            })
            .collect()
    }
}

/// The peak of the step with every update after the backward, when the plan runs them
/// inside it (the report's saving); None when that comparison does not apply.
fn alt_peak(
    graph: &Graph,
    train: Option<&TrainSummary>,
    options: &BuildOptions,
) -> Result<Option<u64>, StageError> {
    (train.is_some()
        && options.optimizer_in_backward
        && train.is_some_and(|t| t.clip_grad_norm.is_none()))
    .then(|| {
        let after = BuildOptions {
            optimizer_in_backward: false,
            ..options.clone()
        };
        scheduled(graph, &after).map(|s| peak_of(graph, &s))
    })
    .transpose()
}

/// Builds the plan of `graph` (forward, or forward + backward + update) for `target`: its
/// workspace buffers are those the target's kernels need; every buffer has its
/// [`Role`], the values in `recomputed` (checkpointing's clones) [`Role::Recomputed`].
pub fn build_for(
    target: Target,
    model: &str,
    graph: &Graph,
    train: Option<&TrainSummary>,
    options: &BuildOptions,
    recomputed: &BTreeSet<ValueId>,
) -> Result<Plan, StageError> {
    let sched = scheduled(graph, options)?;
    schedule::verify(graph, &sched)?;
    let lives = liveness::run(graph, &sched);
    let mut buffers = Buffers::new(graph, &lives);
    let steps = buffers.steps(target, graph, &sched)?;
    origin::assign(
        graph,
        &mut buffers.buffers,
        &buffers.values,
        &steps,
        recomputed,
    );
    let layouts = super::tier::lay_out(
        &mut buffers.buffers,
        &LayoutOptions {
            alignment: options.alignment,
            time_limit: options.layout_time,
            capacity: None,
        },
    );
    let layout = layouts.device;
    for i in 0..buffers.buffers.len() {
        if let Some(root) = buffers.buffers[i].view_of {
            buffers.buffers[i].offset =
                buffers.buffers[root.index()].offset + buffers.buffers[i].view_offset;
        }
    }
    let alt_peak = alt_peak(graph, train, options)?;
    let mut report = report(
        graph,
        &buffers.buffers,
        &buffers.values,
        &steps,
        &layout,
        alt_peak,
        options.optimizer_in_backward,
    );
    report.precision = train.and_then(|t| precision_summary(graph, &sched, t.precision));
    (report.host, report.transfers) = super::host::report(
        &buffers.buffers,
        &steps,
        (layouts.host, train.map_or(1, |t| t.accumulate)),
    );
    Ok(Plan {
        model: model.to_string(),
        params: buffers.params(graph),
        optim_state: buffers.optim_state(graph),
        inputs: buffers.inputs(graph),
        outputs: buffers.outputs(graph),
        buffers: buffers.buffers,
        steps,
        arena_bytes: layout.size,
        host_bytes: report.host.as_ref().map_or(0, |h| h.arena),
        alignment: options.alignment,
        target,
        train: train.cloned(),
        report,
        source_lines: BTreeMap::new(),
        pipeline: None,
        stages: Vec::new(),
    })
}

/// The casts of a mixed-precision step (none for fp32).
fn precision_summary(
    graph: &Graph,
    schedule: &Schedule,
    precision: crate::settings::Precision,
) -> Option<PrecisionSummary> {
    if precision == crate::settings::Precision::Fp32 {
        return None;
    }
    let mut summary = PrecisionSummary {
        precision,
        casts: 0,
        cast_bytes: 0,
        weight_copies: 0,
        weight_copy_bytes: 0,
        loss_scaling: false,
    };
    let dependent = graph.input_dependent();
    for &v in &schedule.order {
        let node = graph.node(v);
        match node.op {
            Op::Cast { .. } => {
                summary.casts += 1;
                summary.cast_bytes += node.ty.bytes();
                if node.phase == Phase::Forward
                    && crate::passes::checkpoint::is_weight_copy(graph, &dependent, v)
                {
                    summary.weight_copies += 1;
                    summary.weight_copy_bytes += node.ty.bytes();
                }
            }
            // A group of parameter casts (`passes::cast_groups`): weight copies, each one.
            Op::CastGroup { tensors, .. } => {
                summary.casts += u64::from(tensors);
                summary.cast_bytes += node.ty.bytes();
                if node.phase == Phase::Forward {
                    summary.weight_copies += u64::from(tensors);
                    summary.weight_copy_bytes += node.ty.bytes();
                }
            }
            Op::LossScaleUpdate { .. } => summary.loss_scaling = true,
            _ => {}
        }
    }
    Some(summary)
}

fn report(
    graph: &Graph,
    buffers: &[Buffer],
    values: &[ValueId],
    steps: &[Step],
    layout: &arena::Layout,
    alt_peak: Option<u64>,
    in_backward: bool,
) -> Report {
    // Views hold no bytes of their own: every sum below counts their roots only, and only
    // the device's (the host tier has its own account, `super::host`).
    let owned = || {
        buffers
            .iter()
            .filter(|b| b.view_of.is_none() && b.tier.is_device())
    };
    let sum = |c: BufferClass| {
        owned()
            .filter(|b| b.class == c)
            .map(|b| b.bytes)
            .sum::<u64>()
    };
    let mut saved: BTreeMap<&'static str, (u64, u64)> = BTreeMap::new();
    let is_saved = origin::saved_for_backward(buffers, steps);
    for (&v, b) in values.iter().zip(buffers) {
        if is_saved[b.id.index()] {
            // An activation waiting on the host is named by the op that computed it.
            let e = saved
                .entry(graph.node(on_device(graph, v)).op.name())
                .or_default();
            e.0 += 1;
            e.1 += b.bytes;
        }
    }
    let n = steps.len().max(1);
    let live = live_bytes(n, owned().map(|b| (b.bytes, b.first, b.last)));
    let mut phases: Vec<PhasePeak> = Vec::new();
    for (s, step) in steps.iter().enumerate() {
        match phases.iter_mut().find(|p| p.phase == step.phase) {
            Some(p) => p.peak = p.peak.max(live[s]),
            None => phases.push(PhasePeak {
                phase: step.phase,
                peak: live[s],
            }),
        }
    }
    let peak = live.iter().copied().max().unwrap_or(0);
    let count = |trained_only: bool| {
        graph
            .params()
            .iter()
            .filter(|&&p| match graph.node(p).op {
                // Running statistics are state, not parameters (PyTorch's buffers).
                Op::Param { buffer: true, .. } => false,
                Op::Param { frozen, .. } => !trained_only || !frozen,
                _ => !trained_only,
            })
            .map(|&p| match crate::passes::partition::full_shape(graph, p) {
                // A ZeRO-3 shard counts the parameters of the whole tensor.
                Some(shape) => shape.iter().map(|&d| d as u64).product(),
                None => crate::passes::quantize::weights(graph, p),
            })
            .sum()
    };
    Report {
        param_count: count(false),
        trainable_param_count: count(true),
        bytes: Bytes {
            params: sum(BufferClass::Param),
            grads: sum(BufferClass::Gradient) + gradient_members(buffers),
            optimizer: sum(BufferClass::OptimState),
            activations: buffers
                .iter()
                .filter(|b| is_saved[b.id.index()])
                .map(|b| b.bytes)
                .sum(),
            workspace: sum(BufferClass::Workspace),
            inputs: sum(BufferClass::Input),
            peak,
            lower_bound: layout.lower_bound,
            arena: layout.size,
            no_reuse: owned().map(|b| b.bytes).sum(),
        },
        phases,
        saved: saved
            .into_iter()
            .map(|(op, (count, bytes))| SavedKind {
                op: op.to_string(),
                count,
                bytes,
            })
            .collect(),
        optimizer_in_backward: in_backward,
        optimizer_in_backward_saving: alt_peak.map(|p| p.saturating_sub(peak)),
        flops: steps.iter().map(|s| s.flops).sum(),
        steps: steps.len(),
        layout_optimal: layout.optimal,
        checkpoint: None,
        precision: None,
        estimate: None,
        largest_at_peak: Vec::new(),
        device: None,
        host: None,
        transfers: None,
        unified: None,
        quantized: crate::passes::quantize::summary(graph),
        parallel: None,
    }
}
