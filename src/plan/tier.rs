//! The two memory tiers of a plan: the device arena and, with `--offload`, the host arena.
//! Which tier a value lives in follows from the graph alone (copies to the host make host
//! values; optimizer state read only by updates on host values is host state), and each
//! tier is laid out as its own arena by the same layout and checked by the same validator.

use super::{Buffer, Plan};
use crate::ir::{Graph, Op, ValueId};
use crate::passes::arena::{self, validate, BufferRequest, Layout, LayoutOptions, LayoutViolation};
use serde::{Deserialize, Serialize};

/// Where a buffer's bytes are: in the device arena (every buffer of a plan without
/// offload), or in the host arena.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    #[default]
    Device,
    Host,
}

impl Tier {
    /// Whether this is the device tier (which plan JSON leaves unsaid).
    pub fn is_device(&self) -> bool {
        *self == Tier::Device
    }
}

/// Where a plan step does its work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// On the device: a kernel or library call over device buffers (or nothing, for a
    /// view).
    Device,
    /// On the host, over host buffers only (an update of offloaded optimizer state).
    Host,
    /// A copy between the tiers: `copy_to_host`, `copy_to_device` or `copy_from_host`.
    Transfer,
}

impl Plan {
    /// Where `step` runs: a copy between the tiers is a transfer, a step whose buffers lie
    /// in the host arena runs on the host (the verifier's [`misplaced`] guarantees a step
    /// that copies nothing has all its buffers in one tier), every other step on the device.
    pub fn placement(&self, step: &super::Step) -> Placement {
        if step.op.is_transfer() {
            return Placement::Transfer;
        }
        let first = (step
            .inputs
            .iter()
            .chain(&step.output)
            .chain(&step.workspace))
        .next()
        .and_then(|b| self.buffers.get(b.index()));
        match first.map(|b| b.tier) {
            Some(Tier::Host) => Placement::Host,
            _ => Placement::Device,
        }
    }
}

/// The device value that `v` is a host copy of, or `v` itself when it is no copy.
pub fn on_device(graph: &Graph, v: ValueId) -> ValueId {
    match graph.node(v).op {
        Op::CopyToHost => graph.node(v).inputs[0],
        _ => v,
    }
}

/// Whether step `u` runs on the host: it reads a value copied to the host and is not itself
/// a copy back to the device.
fn on_host(graph: &Graph, u: ValueId) -> bool {
    let node = graph.node(u);
    !node.op.is_transfer()
        && node
            .inputs
            .iter()
            .any(|&i| matches!(graph.node(i).op, Op::CopyToHost))
}

/// The tier of value `v`: the host for a copy to the host, for what a step on the host
/// outputs, and for optimizer state that only steps on the host read; the device otherwise.
pub fn tier_of(graph: &Graph, v: ValueId) -> Tier {
    let host = match graph.node(v).op {
        Op::CopyToHost => true,
        Op::OptimState { .. } => {
            let users = graph.users(v);
            !users.is_empty() && users.into_iter().all(|u| on_host(graph, u))
        }
        _ => on_host(graph, v),
    };
    if host {
        Tier::Host
    } else {
        Tier::Device
    }
}

/// The layouts of both tiers, each over its own buffers.
pub struct TierLayouts {
    /// The device arena: the layout of its buffers, and offsets for every buffer (a host
    /// buffer's is its offset in the host arena).
    pub device: Layout,
    /// The host arena's layout over the host buffers (offsets in their order), if any.
    pub host: Option<Layout>,
}

/// Lays out the device buffers of `buffers` in one arena and the host buffers in another,
/// and writes each buffer's offset within its tier's arena.
pub fn lay_out(buffers: &mut [Buffer], options: &LayoutOptions) -> TierLayouts {
    let of = |tier: Tier, buffers: &[Buffer]| -> (Vec<usize>, Layout) {
        let index: Vec<usize> = (0..buffers.len())
            .filter(|&i| buffers[i].tier == tier)
            .collect();
        let requests: Vec<BufferRequest> = index.iter().map(|&i| buffers[i].request()).collect();
        (index, arena::layout(&requests, options))
    };
    let (device_index, mut device) = of(Tier::Device, buffers);
    let host = buffers
        .iter()
        .any(|b| b.tier == Tier::Host)
        .then(|| of(Tier::Host, buffers));
    let mut offsets = vec![0; buffers.len()];
    for (&i, &off) in device_index.iter().zip(&device.offsets) {
        offsets[i] = off;
    }
    if let Some((index, layout)) = &host {
        for (&i, &off) in index.iter().zip(&layout.offsets) {
            offsets[i] = off;
        }
    }
    for (b, &off) in buffers.iter_mut().zip(&offsets) {
        b.offset = off;
    }
    device.offsets = offsets;
    TierLayouts {
        device,
        host: host.map(|(_, layout)| layout),
    }
}

/// The layout violations of `plan` in each tier: each tier's buffers checked against its
/// own arena (`arena_bytes` or `host_bytes`), the other tier's counting no bytes at offset
/// 0; violations
/// index the plan's buffers.
pub fn violations(plan: &Plan, alignment: u64) -> Vec<LayoutViolation> {
    [
        (Tier::Device, plan.arena_bytes),
        (Tier::Host, plan.host_bytes),
    ]
    .into_iter()
    .flat_map(|(tier, size)| {
        let (requests, offsets): (Vec<BufferRequest>, Vec<u64>) = plan
            .buffers
            .iter()
            .map(|b| match b.tier == tier {
                true => (b.request(), b.offset),
                false => (
                    BufferRequest {
                        size: 0,
                        ..b.request()
                    },
                    0,
                ),
            })
            .unzip();
        validate(&requests, &offsets, size, alignment)
            .err()
            .unwrap_or_default()
    })
    .collect()
}

/// Steps whose operands are not where they run: a copy to the host reads a device buffer
/// and outputs a host one, a copy to the device writes a device buffer from a host one, a
/// copy from the host reads a host buffer and outputs a device one, and every other step's
/// buffers lie in one tier. Each entry names the step.
pub fn misplaced(plan: &Plan) -> Vec<String> {
    let tier = |b: &super::BufferId| plan.buffers.get(b.index()).map(|x| x.tier);
    let mut out = Vec::new();
    for (s, step) in plan.steps.iter().enumerate() {
        let inputs: Vec<_> = step.inputs.iter().map(tier).collect();
        let output = step.output.as_ref().map(tier);
        let workspace = step.workspace.as_ref().map(tier);
        let (d, h) = (Some(Tier::Device), Some(Tier::Host));
        let fine = match step.op {
            Op::CopyToHost => inputs == [d] && output == Some(h),
            Op::CopyToDevice => inputs == [d, h],
            Op::CopyFromHost => inputs == [h] && output == Some(d),
            _ => {
                let mut all = inputs.iter().chain(&output).chain(&workspace);
                let first = all.clone().next().copied().flatten();
                all.all(|&t| t == first)
            }
        };
        if !fine {
            out.push(format!(
                "step {s} ({}) mixes device and host buffers where it does not copy between them",
                step.op.name()
            ));
        }
    }
    out
}
