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
    /// Proven lower bound of the host layout.
    pub lower_bound: u64,
}

/// Bytes copied between the device and the host in one step (once per step with gradient
/// accumulation: the copies belong to the update).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transfers {
    /// Device to host (gradients and parameters for a host update).
    pub to_host: u64,
    /// Host to device (updated parameters).
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
    host: Option<Layout>,
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
        match step.op {
            Op::CopyToHost => transfers.to_host += step.output.as_ref().map_or(0, bytes),
            Op::CopyToDevice => transfers.to_device += step.inputs.first().map_or(0, bytes),
            _ => continue,
        }
        transfers.copies += 1;
    }
    let host = HostBytes {
        arena: layout.size,
        optimizer: buffers
            .iter()
            .filter(|b| b.tier == Tier::Host && b.class == BufferClass::OptimState)
            .map(|b| b.bytes)
            .sum(),
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
        "  host arena: {} ({} bytes; optimizer state {} bytes, lower bound {} bytes), updated on the host",
        human_bytes(h.arena),
        grouped(h.arena),
        grouped(h.optimizer),
        grouped(h.lower_bound)
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
            "  estimated extra step time on {}: copies {} over {} ({:.0} GB/s assumed) + host updates {} ({:.0} GB/s assumed) - {} overlapped with backward = {} (an estimate, not a measurement)",
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
