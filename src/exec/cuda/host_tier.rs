//! The host tier of an offloaded plan on the CUDA backend: the host arena, page-locked so
//! copies run asynchronously, with the CPU kernels that run the plan's host steps on it
//! (the same as the CPU backend's), and a copy stream beside the compute stream, ordered
//! against it as [`crate::exec::copy_order`] lays out.

use super::device_error;
use crate::exec::copy_order::{compute_waits, copied_device_bytes};
use crate::exec::cpu::CpuExecutor;
use crate::exec::ExecError;
use crate::ir::Op;
use crate::plan::{BufferId, Plan};
use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream, DriverError};
use std::sync::Arc;

/// The host arena and what runs on it and from it.
pub(super) struct HostTier {
    /// The host arena, and the CPU kernels of the host steps.
    cpu: CpuExecutor,
    /// The stream the copies between the tiers run on.
    copy: Arc<CudaStream>,
    /// Per copy step, the event the compute stream records at the copy's place and the one
    /// the copy stream records after the copy (None for every other step).
    events: Vec<Option<(CudaEvent, CudaEvent)>>,
    /// Per step, the copies the compute stream waits for before it.
    waits: Vec<Vec<usize>>,
}

impl HostTier {
    /// The host tier of `plan` in `ctx` (None for a plan without one): its host arena
    /// zeroed and page-locked, a copy stream and the events of every copy.
    pub(super) fn new(plan: &Plan, ctx: &Arc<CudaContext>) -> Result<Option<HostTier>, ExecError> {
        if plan.host_bytes == 0 {
            return Ok(None);
        }
        let mut cpu = CpuExecutor::host_side(plan);
        let (base, len) = cpu.host_arena();
        ctx.bind_to_thread().map_err(device_error)?;
        // SAFETY: `base..base + len` is the host arena's allocation, which does not move
        // while `cpu` lives; `Drop` unregisters it before `cpu` frees it.
        unsafe { sys::cuMemHostRegister_v2(base.cast(), len, 0) }
            .result()
            .map_err(device_error)?;
        let flags = Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let pair =
            || -> Result<_, DriverError> { Ok((ctx.new_event(flags)?, ctx.new_event(flags)?)) };
        let mut tier = HostTier {
            cpu,
            copy: ctx.new_stream().map_err(device_error)?,
            events: Vec::with_capacity(plan.steps.len()),
            waits: compute_waits(plan),
        };
        for step in &plan.steps {
            let events = step.op.is_transfer().then(pair).transpose();
            tier.events.push(events.map_err(device_error)?);
        }
        Ok(Some(tier))
    }

    /// Issues copy step `s` of `plan` on the copy stream, after the work issued on
    /// `compute` so far; the device arena starts at `device_base`.
    pub(super) fn copy(
        &mut self,
        plan: &Plan,
        s: usize,
        compute: &CudaStream,
        device_base: u64,
    ) -> Result<(), ExecError> {
        let step = &plan.steps[s];
        let not_a_copy = || ExecError::Unsupported(format!("step {s} is not a copy"));
        let (ready, done) = self.events[s].as_ref().ok_or_else(not_a_copy)?;
        let device = copied_device_bytes(plan, step).ok_or_else(not_a_copy)?;
        let host = match step.op {
            Op::CopyToHost => step.output,
            Op::CopyToDevice => step.inputs.get(1).copied(),
            _ => step.inputs.first().copied(),
        };
        let host = &plan.buffers[host.ok_or_else(not_a_copy)?.index()];
        let n = host.ty.bytes();
        let (base, len) = self.cpu.host_arena();
        if n > device.end - device.start || host.offset + n > len as u64 {
            return Err(ExecError::Unsupported(format!(
                "step {s} ({}) copies {n} bytes that do not fit its buffers",
                step.op.name()
            )));
        }
        ready.record(compute).map_err(device_error)?;
        self.copy.wait(ready).map_err(device_error)?;
        // SAFETY: the range was checked to lie inside the page-locked host arena; no Rust
        // reference into it lives while copies are in flight (host steps, reads and writes
        // drain the copy stream first), and the device range is the copied buffer's,
        // inside the arena at `device_base` (the plan verifier placed it).
        let host =
            unsafe { std::slice::from_raw_parts_mut(base.add(host.offset as usize), n as usize) };
        let stream = self.copy.cu_stream();
        let at = device_base + device.start;
        unsafe {
            match step.op {
                Op::CopyToHost => result::memcpy_dtoh_async(host, at, stream),
                _ => result::memcpy_htod_async(at, host, stream),
            }
        }
        .map_err(device_error)?;
        done.record(&self.copy).map_err(device_error)
    }

    /// Makes `compute` wait for the copies step `s` must follow.
    pub(super) fn wait_before(&self, s: usize, compute: &CudaStream) -> Result<(), ExecError> {
        for &c in &self.waits[s] {
            if let Some((_, done)) = &self.events[c] {
                compute.wait(done).map_err(device_error)?;
            }
        }
        Ok(())
    }

    /// Makes `compute` wait for every copy issued so far (at a micro-step's end).
    pub(super) fn join(&self, compute: &CudaStream) -> Result<(), ExecError> {
        compute.join(&self.copy).map_err(device_error)
    }

    /// Waits on the host for every copy issued so far.
    pub(super) fn drain(&self) -> Result<(), ExecError> {
        self.copy.synchronize().map_err(device_error)
    }

    /// Runs host step `s` on the host once the copies issued so far are done, as step
    /// `number` of a run seeded `seed`, in micro-step `micro`.
    pub(super) fn run(&mut self, s: usize, keys: (u64, u64, u32)) -> Result<(), ExecError> {
        self.drain()?;
        self.cpu.run_host_step(s, keys)
    }

    /// Whether buffer `b` lies in the host arena.
    pub(super) fn holds(&self, b: BufferId) -> bool {
        self.cpu.on_host(b)
    }

    /// The bytes of host buffer `b`, once the copies are done.
    pub(super) fn read(&self, b: BufferId) -> Result<Vec<u8>, ExecError> {
        self.drain()?;
        Ok(self.cpu.host_bytes(b)?.to_vec())
    }

    /// Overwrites host buffer `b` with `bytes` (its exact size), once the copies are done.
    pub(super) fn write(&mut self, b: BufferId, bytes: &[u8]) -> Result<(), ExecError> {
        self.drain()?;
        let into = self.cpu.host_bytes_mut(b)?;
        if into.len() != bytes.len() {
            return Err(ExecError::Shape(format!(
                "a host buffer holds {} bytes, got {}",
                into.len(),
                bytes.len()
            )));
        }
        into.copy_from_slice(bytes);
        Ok(())
    }
}

impl Drop for HostTier {
    fn drop(&mut self) {
        // Errors cannot be returned from here; the arena is freed with `cpu` either way.
        let _ = self.copy.synchronize();
        let (base, _) = self.cpu.host_arena();
        // SAFETY: `base` was registered in `new` and no copy is in flight any more.
        let _ = unsafe { sys::cuMemHostUnregister(base.cast()) };
    }
}
