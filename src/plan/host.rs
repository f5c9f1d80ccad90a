//! The host side of an offloaded plan's report: the host arena's bytes and what it holds,
//! and the bytes the step copies between the device and the host.

use super::{grouped, human_bytes, Buffer, BufferClass, Step, Tier};
use crate::ir::Op;
use crate::passes::arena::Layout;
use serde::{Deserialize, Serialize};

use std::fmt::Write;

/// The host arena of an offloaded plan, exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostBytes {
    /// The host arena the layout needs.
    pub arena: u64,
    /// Of it, the optimizer state (persistent).
    pub optimizer: u64,
    /// The saved activations copied there (`offload = activations`), summed over the
    /// buffers (they need not all be live at once).
    #[serde(default)]
    pub activations: u64,
    /// Proven lower bound of the host layout.
    pub lower_bound: u64,
}

/// Bytes copied between the device and the host in one step: the update's copies once, the
/// saved activations' (forward and backward steps) once per micro-batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transfers {
    /// Device to host (gradients and parameters for a host update, saved activations).
    pub to_host: u64,
    /// Host to device (updated parameters, saved activations before backward).
    pub to_device: u64,
    /// Copy steps.
    pub copies: u64,
    /// What the copies and the host updates add to the step on the `--gpu` (the H100
    /// without one), filled by [`crate::compile`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<crate::cost::OffloadTime>,
}

/// The host arena's account and the step's transfers, from the plan's buffers and steps and
/// the host tier's layout; both None for a plan without a host tier.
pub fn report(
    buffers: &[Buffer],
    steps: &[Step],
    (host, micro_steps): (Option<Layout>, u32),
) -> (Option<HostBytes>, Option<Transfers>) {
    let Some(layout) = host else {
        return (None, None);
    };
    let bytes = |b: &super::BufferId| buffers.get(b.index()).map_or(0, |b| b.bytes);
    let mut transfers = Transfers {
        to_host: 0,
        to_device: 0,
        copies: 0,
        time: None,
    };
    for step in steps {
        let times = u64::from(super::runs_per_step(step.phase, micro_steps));
        let (moved, copied) = match step.op {
            Op::CopyToHost => (&mut transfers.to_host, step.output.as_ref()),
            Op::CopyToDevice => (&mut transfers.to_device, step.inputs.get(1)),
            Op::CopyFromHost => (&mut transfers.to_device, step.output.as_ref()),
            _ => continue,
        };
        *moved += times * copied.map_or(0, bytes);
        transfers.copies += times;
    }
    let on_host = |class: BufferClass| -> u64 {
        (buffers.iter())
            .filter(|b| b.tier == Tier::Host && b.class == class)
            .map(|b| b.bytes)
            .sum()
    };
    let host = HostBytes {
        arena: layout.size,
        optimizer: on_host(BufferClass::OptimState),
        activations: on_host(BufferClass::Activation),
        lower_bound: layout.lower_bound,
    };
    (Some(host), Some(transfers))
}

/// The lines on the host tier that the report and its `--summary` table end with (nothing
/// for a plan without one).
pub fn render(out: &mut String, report: &super::Report) {
    let (Some(h), Some(t)) = (&report.host, &report.transfers) else {
        return;
    };
    let _ = writeln!(
        out,
        "  host arena: {} ({} bytes; optimizer state {} bytes, saved activations {} bytes, lower bound {} bytes){}",
        human_bytes(h.arena),
        grouped(h.arena),
        grouped(h.optimizer),
        grouped(h.activations),
        grouped(h.lower_bound),
        if h.optimizer > 0 { ", updated on the host" } else { "" }
    );
    let _ = writeln!(
        out,
        "  transfers per step: {} device->host, {} host->device ({} copies)",
        human_bytes(t.to_host),
        human_bytes(t.to_device),
        t.copies
    );
    if let Some(o) = &t.time {
        let ms = crate::cost::ms;
        let _ = writeln!(
            out,
            "  estimated extra step time on {}: copies {} over {} ({:.0} GB/s assumed) + host updates {} ({:.0} GB/s assumed) - {} overlapped with the device's compute = {} (an estimate, not a measurement)",
            o.gpu.spec().name,
            ms(o.transfer_seconds),
            o.link,
            o.link_bandwidth / 1e9,
            ms(o.host_update_seconds),
            crate::cost::HOST_UPDATE_BANDWIDTH / 1e9,
            ms(o.overlapped_seconds.min(o.transfer_seconds + o.host_update_seconds)),
            ms(o.extra_seconds)
        );
    }
}
