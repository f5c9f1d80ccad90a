//! The time an offloaded plan (`--offload`) adds to a step: its copies over the GPU's host
//! link and its updates on the host's CPU, less what hides behind the device's backward.
//!
//! Assumptions, stated: copies run one at a time at the link's one-direction bandwidth
//! ([`super::HostLink`], no duplex overlap), each paying [`LAUNCH_OVERHEAD_S`] as the
//! `cudaMemcpyAsync` that issues it; the host updates stream every byte they touch at
//! [`HOST_UPDATE_BANDWIDTH`]. What overlaps is what the plan's stream order allows
//! ([`stream_time`]): a copy to the host runs beside the kernels after its producer until
//! one reuses its bytes, a prefetch beside those from the moment its bytes are free until
//! its reader, and host updates beside whatever kernels follow (ZeRO-Offload's overlap with
//! the optimizer in backward); the step ends once its copies are done. So the extra time
//! is the two streams' span less the device's own time.

use super::{Gpu, StepTime, Work, LAUNCH_OVERHEAD_S};
use crate::ir::{Op, Phase};
use crate::plan::copy_order::copy_order;
use crate::plan::{Placement, Plan};
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
    /// Of the copies' and host updates' time, what runs beside the device's work (on the
    /// two streams as [`stream_time`] lays them out).
    pub overlapped_seconds: f64,
    /// What the step takes longer: `max(0, transfer + host update - overlapped)`.
    pub extra_seconds: f64,
}

/// The time offload adds to a step of `plan` on `gpu`, given the device steps' estimates
/// (`device`, in plan order); None for a plan without copies. The step is laid out on the
/// two streams as the CUDA backend issues it (see [`stream_time`]).
pub fn offload_time(plan: &Plan, gpu: Gpu, device: &[StepTime]) -> Option<OffloadTime> {
    let link = gpu.spec().host_link;
    let ty = |b: &crate::plan::BufferId| plan.buffers.get(b.index()).map(|b| &b.ty);
    let mut off = vec![0.0; plan.steps.len()];
    let (mut copied, mut updated, mut copies) = (0u64, 0u64, 0u32);
    for (s, step) in plan.steps.iter().enumerate() {
        let times = plan.runs(step.phase);
        let bytes = match step.op {
            Op::CopyToHost => step.output.as_ref().and_then(ty).map_or(0, |t| t.bytes()),
            Op::CopyToDevice | Op::CopyFromHost => {
                step.inputs.first().and_then(ty).map_or(0, |t| t.bytes())
            }
            _ if plan.placement(step) == Placement::Host => {
                let inputs: Vec<_> = step.inputs.iter().filter_map(ty).collect();
                let bytes = Work::new(&step.op, step.flops, &inputs, None, 0).bytes;
                off[s] = bytes as f64 / HOST_UPDATE_BANDWIDTH;
                updated += bytes;
                continue;
            }
            _ => continue,
        };
        off[s] = bytes as f64 / link.bandwidth + LAUNCH_OVERHEAD_S;
        copied += u64::from(times) * bytes;
        copies += times;
    }
    if copies == 0 {
        return None;
    }
    let transfer = copied as f64 / link.bandwidth + f64::from(copies) * LAUNCH_OVERHEAD_S;
    let host = updated as f64 / HOST_UPDATE_BANDWIDTH;
    let mut on_device = vec![0.0; plan.steps.len()];
    for t in device {
        on_device[t.step] += t.seconds;
    }
    let device_total: f64 = (plan.steps.iter().zip(&on_device))
        .map(|(step, t)| t * f64::from(plan.runs(step.phase)))
        .sum();
    let extra = (stream_time(plan, &on_device, &off) - device_total).max(0.0);
    Some(OffloadTime {
        gpu,
        link: link.name.to_string(),
        link_bandwidth: link.bandwidth,
        transfer_seconds: transfer,
        host_update_seconds: host,
        overlapped_seconds: (transfer + host - extra).max(0.0),
        extra_seconds: extra,
    })
}

/// The time a step of `plan` takes on the CUDA backend's two streams, given each plan
/// step's time on the device (`device`) and off it (`off`: a copy or a host step), as
/// [`crate::plan::copy_order`] orders them: device steps one after another on the compute
/// stream, each after the copies it waits for; copies and host steps one after another on
/// the copy stream, each copy after the device step it waits for (after all the work
/// issued before it where that step did not run in this micro-step); each micro-step's
/// copies after the previous micro-step's work, and its end after its copies.
pub fn stream_time(plan: &Plan, device: &[f64], off: &[f64]) -> f64 {
    let order = copy_order(plan);
    let (mut compute, mut copy) = (0.0f64, 0.0f64);
    let mut done = vec![0.0f64; plan.steps.len()];
    let micro_steps = plan.micro_steps();
    for micro in 0..micro_steps {
        let last = micro + 1 == micro_steps;
        let ran = |t: usize| last || plan.steps[t].phase != Phase::Update;
        copy = copy.max(compute);
        for (s, step) in plan.steps.iter().enumerate() {
            if !ran(s) {
                continue;
            }
            let time = |times: &[f64]| times.get(s).copied().unwrap_or(0.0);
            match plan.placement(step) {
                Placement::Device => {
                    let waits = order.compute_waits[s].iter().map(|&c| done[c]);
                    compute = waits.fold(compute, f64::max) + time(device);
                    done[s] = compute;
                }
                Placement::Transfer => {
                    let after = match order.copy_waits[s] {
                        Some(t) if ran(t) => done[t],
                        Some(_) => compute,
                        None => 0.0,
                    };
                    copy = copy.max(after) + time(off);
                    done[s] = copy;
                }
                Placement::Host => {
                    copy += time(off);
                    done[s] = copy;
                }
            }
        }
        compute = compute.max(copy);
    }
    compute
}
