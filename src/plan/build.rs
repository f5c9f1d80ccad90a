//! Graph + schedule to Plan: buffers from lifetimes, offsets from the arena layout, steps
//! with FLOPs, and the memory report.

use super::report::{live_bytes, Bytes, PhasePeak, PrecisionSummary, Report, SavedKind};
use super::*;
use crate::exec::kernels::workspace_bytes;
use crate::ir::cost::flops;
use crate::ir::{Graph, Op, ValueId};
use crate::passes::arena::{self, BufferRequest, LayoutOptions};
use crate::passes::liveness::{self, Interval};
use crate::passes::schedule::{self, Schedule, ScheduleOptions};
use crate::passes::StageError;
use std::collections::BTreeMap;
use std::time::Duration;

/// Choices the plan builder makes.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    pub optimizer_in_backward: bool,
    pub layout_time: Duration,
    pub alignment: u64,
}

/// Values of the graph that are parameter gradients (they get class `Gradient`).
fn gradient_values(graph: &Graph) -> Vec<ValueId> {
    graph
        .values()
        .filter_map(|v| match graph.node(v).op {
            Op::AdamW(_) | Op::Sgd(_) => Some(graph.node(v).inputs[1]),
            _ => None,
        })
        .collect()
}

fn class_of(graph: &Graph, v: ValueId, grads: &[ValueId]) -> BufferClass {
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
        _ if class == BufferClass::Gradient => {
            format!("grad.{}", grad_of.get(&v).cloned().unwrap_or_default())
        }
        op if node.scope.is_empty() => format!("{}{v}", op.name()),
        op => format!("{}/{}{v}", node.scope, op.name()),
    }
}

fn peak_of(graph: &Graph, schedule: &Schedule) -> u64 {
    let lives = liveness::run(graph, schedule);
    let spans = graph.values().filter_map(|v| {
        let bytes = graph.node(v).ty.bytes();
        lives[v.index()]
            .filter(|_| bytes > 0)
            .map(|i| (bytes, i.first, i.last))
    });
    live_bytes(schedule.order.len().max(1), spans)
        .into_iter()
        .max()
        .unwrap_or(0)
}

/// Builds the plan of `graph` (forward, or forward + backward + update).
pub fn build(
    model: &str,
    graph: &Graph,
    train: Option<&crate::front::train::TrainSpec>,
    options: &BuildOptions,
) -> Result<Plan, StageError> {
    let sched = schedule::run(
        graph,
        &ScheduleOptions {
            optimizer_in_backward: options.optimizer_in_backward,
        },
    )?;
    schedule::verify(graph, &sched)?;
    let lives = liveness::run(graph, &sched);
    let grads = gradient_values(graph);
    let mut grad_of = BTreeMap::new();
    for v in graph.values() {
        if let Op::AdamW(_) | Op::Sgd(_) = graph.node(v).op {
            if let Op::Param { name, .. } = &graph.node(graph.node(v).inputs[0]).op {
                grad_of.insert(graph.node(v).inputs[1], name.clone());
            }
        }
    }
    let mut buffers: Vec<Buffer> = Vec::new();
    let mut buffer_of: Vec<Option<BufferId>> = vec![None; graph.len()];
    let mut buffer_values: Vec<ValueId> = Vec::new();
    for v in graph.values() {
        let Some(Interval { first, last }) = lives[v.index()] else {
            continue;
        };
        let ty = graph.node(v).ty.clone();
        if ty.bytes() == 0 {
            continue;
        }
        let class = class_of(graph, v, &grads);
        let id = BufferId(buffers.len() as u32);
        buffer_of[v.index()] = Some(id);
        buffer_values.push(v);
        buffers.push(Buffer {
            id,
            name: name_of(graph, v, class, &grad_of),
            bytes: ty.bytes(),
            ty,
            offset: 0,
            first,
            last,
            class,
        });
    }
    let missing = |v: ValueId| StageError::internal("plan", format!("{v} has no buffer"));
    let mut steps = Vec::with_capacity(sched.order.len());
    for (s, &v) in sched.order.iter().enumerate() {
        let node = graph.node(v);
        let in_types: Vec<&crate::ir::TensorType> =
            node.inputs.iter().map(|&i| &graph.node(i).ty).collect();
        let inputs = node
            .inputs
            .iter()
            .map(|&i| buffer_of[i.index()].ok_or_else(|| missing(i)))
            .collect::<Result<Vec<_>, _>>()?;
        let ws = workspace_bytes(&node.op, &in_types, &node.ty);
        let workspace = (ws > 0).then(|| {
            let id = BufferId(buffers.len() as u32);
            let ty = crate::ir::TensorType::new(crate::ir::DType::F32, vec![(ws / 4) as usize]);
            buffers.push(Buffer {
                id,
                name: format!("workspace.{}{v}", node.op.name()),
                ty,
                bytes: ws,
                offset: 0,
                first: s,
                last: s,
                class: BufferClass::Workspace,
            });
            id
        });
        steps.push(Step {
            op: node.op.clone(),
            inputs,
            output: buffer_of[v.index()],
            workspace,
            flops: flops(&node.op, &in_types, &node.ty),
            phase: node.phase,
            scope: node.scope.clone(),
        });
    }
    let requests: Vec<BufferRequest> = buffers.iter().map(Buffer::request).collect();
    let layout = arena::layout(
        &requests,
        &LayoutOptions {
            alignment: options.alignment,
            time_limit: options.layout_time,
            capacity: None,
        },
    );
    for (b, &off) in buffers.iter_mut().zip(&layout.offsets) {
        b.offset = off;
    }
    let params = graph
        .params()
        .into_iter()
        .filter_map(|p| {
            let Op::Param { name, init, .. } = &graph.node(p).op else {
                return None;
            };
            let grad = graph.values().find_map(|u| match graph.node(u).op {
                Op::AdamW(_) | Op::Sgd(_) if graph.node(u).inputs[0] == p => {
                    buffer_of[graph.node(u).inputs[1].index()]
                }
                _ => None,
            });
            buffer_of[p.index()].map(|buffer| ParamBinding {
                name: name.clone(),
                buffer,
                init: *init,
                grad,
            })
        })
        .collect();
    let inputs = graph
        .values()
        .filter_map(|v| match &graph.node(v).op {
            Op::Input { name, .. } => buffer_of[v.index()].map(|buffer| InputBinding {
                name: name.clone(),
                buffer,
                id_limit: id_limit(graph, v),
            }),
            _ => None,
        })
        .collect();
    let outputs = graph
        .outputs
        .iter()
        .filter_map(|(n, v)| buffer_of[v.index()].map(|b| (n.clone(), b)))
        .collect();
    let optim_state = buffers
        .iter()
        .zip(&buffer_values)
        .filter_map(|(b, &v)| match graph.node(v).op {
            Op::OptimState { init, .. } => Some(StateBinding { buffer: b.id, init }),
            _ => None,
        })
        .collect();
    let alt_peak = (train.is_some()
        && options.optimizer_in_backward
        && train.is_some_and(|t| t.clip_grad_norm.is_none()))
    .then(|| {
        schedule::run(
            graph,
            &ScheduleOptions {
                optimizer_in_backward: false,
            },
        )
        .map(|s| peak_of(graph, &s))
    })
    .transpose()?;
    let mut report = report(
        graph,
        &buffers,
        &buffer_values,
        &steps,
        &layout,
        alt_peak,
        options.optimizer_in_backward,
    );
    report.precision = train.and_then(|t| precision_summary(graph, &sched, t.precision));
    Ok(Plan {
        model: model.to_string(),
        buffers,
        steps,
        arena_bytes: layout.size,
        alignment: options.alignment,
        params,
        optim_state,
        inputs,
        outputs,
        train: train.cloned(),
        report,
    })
}

/// The casts of a mixed-precision step (none for fp32).
fn precision_summary(
    graph: &Graph,
    schedule: &Schedule,
    precision: crate::front::train::Precision,
) -> Option<PrecisionSummary> {
    if precision == crate::front::train::Precision::Fp32 {
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
                if crate::passes::checkpoint::is_weight_copy(graph, &dependent, v) {
                    summary.weight_copies += 1;
                    summary.weight_copy_bytes += node.ty.bytes();
                }
            }
            Op::LossScaleUpdate { .. } => summary.loss_scaling = true,
            _ => {}
        }
    }
    Some(summary)
}

/// The exclusive bound on valid ids of an integer input, from the ops that read it.
fn id_limit(graph: &Graph, v: ValueId) -> Option<u64> {
    graph
        .users(v)
        .into_iter()
        .filter_map(|u| {
            let node = graph.node(u);
            match node.op {
                Op::Embedding if node.inputs[1] == v => {
                    Some(graph.node(node.inputs[0]).ty.shape[0] as u64)
                }
                Op::CrossEntropy if node.inputs[1] == v => graph
                    .node(node.inputs[0])
                    .ty
                    .shape
                    .last()
                    .map(|&c| c as u64),
                _ => None,
            }
        })
        .min()
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
    let sum = |c: BufferClass| {
        buffers
            .iter()
            .filter(|b| b.class == c)
            .map(|b| b.bytes)
            .sum::<u64>()
    };
    let mut saved: BTreeMap<&'static str, (u64, u64)> = BTreeMap::new();
    let mut is_saved = vec![false; buffers.len()];
    for s in steps
        .iter()
        .filter(|s| s.phase != crate::ir::Phase::Forward)
    {
        for &b in &s.inputs {
            is_saved[b.index()] |= buffers[b.index()].class == BufferClass::Activation;
        }
    }
    for (&v, b) in values.iter().zip(buffers) {
        if is_saved[b.id.index()] {
            let e = saved.entry(graph.node(v).op.name()).or_default();
            e.0 += 1;
            e.1 += b.bytes;
        }
    }
    let n = steps.len().max(1);
    let live = live_bytes(n, buffers.iter().map(|b| (b.bytes, b.first, b.last)));
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
    Report {
        param_count: graph
            .params()
            .iter()
            .map(|&p| graph.node(p).ty.numel())
            .sum(),
        bytes: Bytes {
            params: sum(BufferClass::Param),
            grads: buffers
                .iter()
                .filter(|b| b.class == BufferClass::Gradient)
                .map(|b| b.bytes)
                .sum(),
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
            no_reuse: buffers.iter().map(|b| b.bytes).sum(),
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
    }
}
