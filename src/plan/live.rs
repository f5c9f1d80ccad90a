//! Live bytes of a scheduled graph: the order the build takes, each value's lifetime in it,
//! and the bytes live at each step.

use super::build::BuildOptions;
use super::classes::{gradients, view_roots};
use super::report::live_bytes;
use super::tier::tier_of;
use super::views;
use crate::ir::Graph;
use crate::passes::liveness::{self, Interval};
use crate::passes::schedule::{self, Schedule, ScheduleOptions};
use crate::passes::StageError;

pub(super) fn peak_of(graph: &Graph, schedule: &Schedule) -> u64 {
    profile_of(graph, schedule)
        .bytes
        .into_iter()
        .max()
        .unwrap_or(0)
}

/// Where each value of a scheduled graph lives and how many bytes are live at each step.
pub struct LiveProfile {
    /// Bytes live at each step (buffers of values on the device; workspace not counted).
    pub bytes: Vec<u64>,
    /// Each value's lifetime in steps (a root's over its views'), by value index.
    pub lives: Vec<Option<Interval>>,
    /// Each step's place in the order, by value index (None for sources).
    pub position: Vec<Option<usize>>,
}

fn profile_of(graph: &Graph, schedule: &Schedule) -> LiveProfile {
    let mut lives = liveness::run(graph, schedule);
    let roots = view_roots(graph, &gradients(graph));
    views::extend_roots(&mut lives, &roots);
    let spans = graph.values().filter_map(|v| {
        let bytes = graph.node(v).ty.bytes();
        lives[v.index()]
            .filter(|_| bytes > 0 && roots[v.index()].is_none() && tier_of(graph, v).is_device())
            .map(|i| (bytes, i.first, i.last))
    });
    let bytes = live_bytes(schedule.order.len().max(1), spans);
    let mut position = vec![None; graph.len()];
    for (i, v) in schedule.order.iter().enumerate() {
        position[v.index()] = Some(i);
    }
    LiveProfile {
        bytes,
        lives,
        position,
    }
}

/// The [`LiveProfile`] of `graph` in the order `options` schedules it.
pub fn live_profile(graph: &Graph, options: &BuildOptions) -> Result<LiveProfile, StageError> {
    Ok(profile_of(graph, &scheduled(graph, options)?))
}

/// The most bytes live at once over `graph`'s steps in the order `options` schedules them
/// (buffers of values, workspace not counted: the arena's lower bound before scratch).
pub fn live_peak(graph: &Graph, options: &BuildOptions) -> Result<u64, StageError> {
    Ok(peak_of(graph, &scheduled(graph, options)?))
}

/// `graph`'s steps in the order `options` asks for.
pub(super) fn scheduled(graph: &Graph, options: &BuildOptions) -> Result<Schedule, StageError> {
    schedule::run(
        graph,
        &ScheduleOptions {
            optimizer_in_backward: options.optimizer_in_backward,
            pipeline: options.pipeline,
        },
    )
}

/// The [`LiveProfile`] of `graph` in the order `options` schedules it on `target`, each
/// step's bytes with its own workspace added.
pub fn live_profile_with_workspace(
    graph: &Graph,
    options: &BuildOptions,
    target: super::Target,
) -> Result<LiveProfile, StageError> {
    let schedule = scheduled(graph, options)?;
    let mut profile = profile_of(graph, &schedule);
    for (&v, live) in schedule.order.iter().zip(&mut profile.bytes) {
        let node = graph.node(v);
        let inputs: Vec<_> = node.inputs.iter().map(|&i| &graph.node(i).ty).collect();
        *live += target.workspace_bytes(&node.op, &inputs, &node.ty);
    }
    Ok(profile)
}

/// The most bytes in use at once over `graph`'s steps in the order `options` schedules them
/// on `target`: each step's live values and its own workspace.
pub fn live_peak_with_workspace(
    graph: &Graph,
    options: &BuildOptions,
    target: super::Target,
) -> Result<u64, StageError> {
    let profile = live_profile_with_workspace(graph, options, target)?;
    Ok(profile.bytes.into_iter().max().unwrap_or(0))
}
