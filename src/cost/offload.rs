//! The time an offloaded plan (`--offload`) adds to a step: its copies over the GPU's host
//! link and its updates on the host's CPU, less what hides behind the device's backward.
//!
//! Assumptions, stated: copies run one at a time at the link's one-direction bandwidth
//! ([`super::HostLink`], no duplex overlap), each paying [`LAUNCH_OVERHEAD_S`] as the
//! `cudaMemcpyAsync` that issues it; the host updates stream every byte they touch
//! at [`HOST_UPDATE_BANDWIDTH`]; with the optimizer in backward, copies and host updates
//! overlap the device's backward steps that run after the first copy (ZeRO-Offload's
//! overlap); with activations offloaded, the copies overlap the device's forward and
//! backward steps after the first copy (they run on a copy stream beside the compute);
//! otherwise nothing overlaps (the next forward needs the updated parameters). So the
//! extra time is `max(0, copies + host updates - overlappable)`.

use super::{Gpu, StepTime, Work, LAUNCH_OVERHEAD_S};
use crate::ir::{Op, Phase};
use crate::plan::{Plan, Step};
use serde::{Deserialize, Serialize};

/// Bytes/s a CPU AdamW (or SGD) update streams through host memory: a vectorized,
/// multi-threaded update such as DeepSpeed's CPU-Adam is bound by memory bandwidth, and a
/// server socket's DDR5 sustains on the order of 100 GB/s; half of that is assumed for the
/// update beside the copies (about 1.8 G parameters/s for fp32 AdamW's 28 bytes each).
pub const HOST_UPDATE_BANDWIDTH: f64 = 50e9;

/// What offload adds to the estimated step time on one GPU: an estimate from the stated
/// link and host figures, never a measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OffloadTime {
    /// The GPU whose host link the copies cross.
    pub gpu: Gpu,
    /// The link in words (`PCIe 5.0 x16`, `NVLink-C2C`).
    pub link: String,
    /// The link's assumed bandwidth in bytes/s, one direction.
    pub link_bandwidth: f64,
    /// The copies' time: their bytes at the link's bandwidth, plus the issue overhead of each.
    pub transfer_seconds: f64,
    /// The host updates' time: the bytes they touch at [`HOST_UPDATE_BANDWIDTH`].
    pub host_update_seconds: f64,
    /// The device time that the copies and host updates can hide behind.
    pub overlapped_seconds: f64,
    /// What the step takes longer: `max(0, transfer + host update - overlapped)`.
    pub extra_seconds: f64,
}

/// Whether `step` of `plan` runs off the device: a copy between tiers, or a step on host
/// buffers. The device estimate leaves such steps out; [`offload_time`] costs them.
pub fn off_device(plan: &Plan, step: &Step) -> bool {
    plan.placement(step) != crate::plan::Placement::Device
}

/// The time offload adds to a step of `plan` on `gpu`, given the device steps' estimates
/// (`device`, in plan order); None for a plan without copies.
pub fn offload_time(plan: &Plan, gpu: Gpu, device: &[StepTime]) -> Option<OffloadTime> {
    let link = gpu.spec().host_link;
    let ty = |b: &crate::plan::BufferId| plan.buffers.get(b.index()).map(|b| &b.ty);
    let (mut copied, mut updated, mut first_copy, mut copies) = (0u64, 0u64, None, 0u32);
    for (s, step) in plan.steps.iter().enumerate() {
        if !off_device(plan, step) {
            continue;
        }
        let inputs: Vec<_> = step.inputs.iter().filter_map(ty).collect();
        let times = plan.runs(step.phase);
        match step.op {
            Op::CopyToHost => {
                copied +=
                    u64::from(times) * step.output.as_ref().and_then(ty).map_or(0, |t| t.bytes());
                first_copy.get_or_insert(s);
            }
            Op::CopyToDevice | Op::CopyFromHost => {
                copied += u64::from(times) * inputs.first().map_or(0, |t| t.bytes())
            }
            _ => {
                updated += Work::new(&step.op, step.flops, &inputs, None, 0).bytes;
                continue;
            }
        }
        copies += times;
    }
    let first_copy = first_copy?;
    let activations = plan.steps.iter().any(|s| s.op == Op::CopyFromHost);
    let hides = |phase: Phase| match phase {
        Phase::Backward => activations || plan.report.optimizer_in_backward,
        Phase::Forward => activations,
        Phase::Update => false,
    };
    let overlapped = device
        .iter()
        .filter(|t| t.step > first_copy)
        .filter_map(|t| {
            let phase = plan.steps.get(t.step)?.phase;
            hides(phase).then(|| t.seconds * f64::from(plan.runs(phase)))
        })
        .sum();
    let transfer = copied as f64 / link.bandwidth + f64::from(copies) * LAUNCH_OVERHEAD_S;
    let host = updated as f64 / HOST_UPDATE_BANDWIDTH;
    Some(OffloadTime {
        gpu,
        link: link.name.to_string(),
        link_bandwidth: link.bandwidth,
        transfer_seconds: transfer,
        host_update_seconds: host,
        overlapped_seconds: overlapped,
        extra_seconds: (transfer + host - overlapped).max(0.0),
    })
}
