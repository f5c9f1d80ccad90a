//! Compiling a pipeline: the forward graph cut into stages (`passes::pipeline`), each
//! stage's step planned as a plan of its own in 1F1B order, stage 0's plan carrying the
//! others (`Plan::stages`) and `report.parallel` listing every rank with its stage's bytes.

use crate::diagnostic::UserError;
use crate::ir::{Graph, Op, Span};
use crate::parallel::{Parallel, TensorSplit};
use crate::passes::megatron::SplitError;
use crate::passes::pipeline::{self, order::OneFOneB};
use crate::plan::{self, PipelineStage, Plan};
use crate::{annotated, checked, front, planned, verified, CompileError, Compiled, Options};
use std::collections::BTreeMap;

/// Compiles `module` (its forward graph lowered at the micro-batch size, split over the
/// tensor ranks as `splits` says) as `p.pipeline` stages over `p.microbatches`
/// micro-batches; refusals of the cut point at `train`, the train section's span. The
/// returned graph is stage 0's.
pub(crate) fn compile(
    source: &str,
    ast: front::ast::Model,
    (module, splits): (&front::Module, &BTreeMap<String, TensorSplit>),
    options: &Options,
    p: Parallel,
    train: Span,
) -> Result<Compiled, CompileError> {
    let cut = pipeline::run(&module.graph, p.pipeline, p.microbatches).map_err(|e| match e {
        SplitError::User(u) if u.span.is_none() => CompileError::User(UserError::at(
            train,
            u.message,
            "this train section",
            u.help,
        )),
        e => e.into(),
    })?;
    let positions = param_positions(&module.graph);
    let inputs: Vec<String> = (module.graph.values())
        .filter_map(|v| match &module.graph.node(v).op {
            Op::Input { name, .. } => Some(name.clone()),
            _ => None,
        })
        .collect();
    let mut plans: Vec<Plan> = Vec::with_capacity(cut.graphs.len());
    let mut first_graph = None;
    for (s, graph) in cut.graphs.into_iter().enumerate() {
        let s = s as u32;
        verified(&graph, "pipeline")?;
        let stage = front::Module {
            name: module.name.clone(),
            graph,
            train: module.train.clone(),
            dims: module.dims.clone(),
        };
        let order = OneFOneB::new(s, p.pipeline, p.microbatches);
        let (graph, mut plan) = planned(&stage, options, Some(p), Some(order))?;
        for b in &mut plan.params {
            b.tensor_split = splits.get(&b.name).cloned();
        }
        plan.pipeline = Some(PipelineStage {
            stage: s,
            stages: p.pipeline,
            microbatches: p.microbatches,
            positions: (plan.params.iter())
                .map(|b| positions.iter().position(|n| *n == b.name).unwrap_or(0) as u64)
                .collect(),
            inputs: inputs.clone(),
        });
        first_graph.get_or_insert(graph);
        plans.push(annotated(plan, source));
    }
    let nccl = plans
        .first()
        .and_then(|f| f.report.parallel.as_ref())
        .and_then(|r| r.nccl_reserve);
    let report = plan::pipeline_report(&plans, p, nccl);
    for plan in &mut plans {
        plan.report.parallel = Some(report.clone());
    }
    let mut rest = plans.split_off(1);
    let mut first = plans
        .pop()
        .ok_or_else(|| CompileError::Internal(vec!["a pipeline of no stages".into()]))?;
    first.stages.append(&mut rest);
    Ok(Compiled {
        ast,
        graph: first_graph.unwrap_or_default(),
        plan: checked(first)?,
    })
}

/// The names of the model's trained and frozen parameters in creation order, running
/// statistics left out: a parameter's index here keys its initial values.
fn param_positions(graph: &Graph) -> Vec<String> {
    graph
        .params()
        .into_iter()
        .filter_map(|v| match &graph.node(v).op {
            Op::Param {
                name,
                buffer: false,
                ..
            } => Some(name.clone()),
            _ => None,
        })
        .collect()
}
