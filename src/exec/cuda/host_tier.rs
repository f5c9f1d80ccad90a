//! The host tier of an offloaded plan on the CUDA backend: the host arena, page-locked so
//! copies run asynchronously, with the CPU kernels that run the plan's host steps on it
//! (the same as the CPU backend's), and a copy stream beside the compute stream, ordered
//! against it as [`crate::plan::copy_order`] lays out.
//!
//! A host step is a host function on the copy stream (`cuLaunchHostFunc`): the driver runs
//! it on its own thread once the copies before it are done, and the copies after it (the
//! updated parameter back to the device) wait for it. The thread issuing kernels never
//! blocks on it, so the host updates overlap the kernels issued after them, as
//! ZeRO-Offload's do and as the cost model's offload estimate assumes.

use super::device_error;
use crate::exec::cpu::CpuExecutor;
use crate::exec::ExecError;
use crate::ir::Op;
use crate::plan::copy_order::{copied_device_bytes, copy_order, CopyOrder};
use crate::plan::{BufferId, Placement, Plan};
use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream, DriverError};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// The host arena and what runs on it and from it.
pub(super) struct HostTier {
    /// The host arena, and the CPU kernels of the host steps, shared with the host
    /// functions that run them on the copy stream.
    cpu: Arc<Mutex<CpuExecutor>>,
    /// The host arena's address and bytes (its allocation never moves).
    arena: (usize, usize),
    /// The first failure of a host step run on the copy stream, reported by the next drain.
    failed: Arc<Mutex<Option<ExecError>>>,
    /// The stream the copies between the tiers run on.
    copy: Arc<CudaStream>,
    /// Per step, the event the compute stream records after it where a copy waits for it,
    /// and, for a copy step, the event the copy stream records after the copy.
    events: Vec<(Option<CudaEvent>, Option<CudaEvent>)>,
    /// What waits for what.
    order: CopyOrder,
    /// The step number and seed the host steps run as, set before each step is launched
    /// (a captured graph runs the same host functions every step).
    keys: Arc<Mutex<(u64, u64)>>,
    /// The host functions' data, one per host step and micro-step; they stay in place
    /// while the tier lives, so a captured graph may call them again.
    jobs: BTreeMap<(usize, u32), Box<HostJob>>,
}

impl HostTier {
    /// The host tier of `plan` in `ctx` (None for a plan without one): its host arena
    /// zeroed and page-locked, a copy stream and the events of every copy.
    pub(super) fn new(plan: &Plan, ctx: &Arc<CudaContext>) -> Result<Option<HostTier>, ExecError> {
        if plan.host_bytes == 0 {
            return Ok(None);
        }
        ctx.bind_to_thread().map_err(device_error)?;
        let flags = Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let order = copy_order(plan);
        let mut marked = vec![false; plan.steps.len()];
        for &t in order.copy_waits.iter().flatten() {
            marked[t] = true;
        }
        let event = |wanted: bool| wanted.then(|| ctx.new_event(flags)).transpose();
        let events = (plan.steps.iter().zip(marked))
            .map(|(step, mark)| -> Result<_, DriverError> {
                Ok((event(mark)?, event(step.op.is_transfer())?))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(device_error)?;
        let copy = ctx.new_stream().map_err(device_error)?;
        let mut cpu = CpuExecutor::host_side(plan);
        let (base, len) = cpu.host_arena();
        // SAFETY: `base..base + len` is the host arena's allocation, which does not move
        // while `cpu` lives; the tier's `Drop` unregisters it before `cpu` frees it.
        unsafe { sys::cuMemHostRegister_v2(base.cast(), len, 0) }
            .result()
            .map_err(device_error)?;
        let cpu = Arc::new(Mutex::new(cpu));
        let failed = Arc::new(Mutex::new(None));
        let keys = Arc::new(Mutex::new((1, 0)));
        let host_steps =
            (0..plan.steps.len()).filter(|&s| plan.placement(&plan.steps[s]) == Placement::Host);
        let jobs = host_steps
            .flat_map(|s| (0..plan.micro_steps()).map(move |micro| (s, micro)))
            .map(|(step, micro)| {
                let job = HostJob {
                    cpu: Arc::clone(&cpu),
                    failed: Arc::clone(&failed),
                    keys: Arc::clone(&keys),
                    step,
                    micro,
                };
                ((step, micro), Box::new(job))
            })
            .collect();
        let tier = HostTier {
            cpu,
            arena: (base as usize, len),
            failed,
            copy,
            events,
            order,
            keys,
            jobs,
        };
        Ok(Some(tier))
    }

    /// Makes the copies issued from now on follow the work issued on `compute` so far (at
    /// a micro-step's start).
    pub(super) fn begin(&self, compute: &CudaStream) -> Result<(), ExecError> {
        self.copy.join(compute).map_err(device_error)
    }

    /// Records on `compute` that device step `t` is issued, where a copy waits for it.
    pub(super) fn issued(&self, t: usize, compute: &CudaStream) -> Result<(), ExecError> {
        match &self.events[t].0 {
            Some(mark) => mark.record(compute).map_err(device_error),
            None => Ok(()),
        }
    }

    /// Issues copy step `s` of `plan` on the copy stream, once the last earlier device step
    /// touching its device bytes is done (`ran` tells whether a step ran in this
    /// micro-step; where it did not, the copy follows all the work issued on `compute`);
    /// the device arena starts at `device_base`.
    pub(super) fn copy(
        &self,
        plan: &Plan,
        s: usize,
        (compute, ran): (&CudaStream, impl Fn(usize) -> bool),
        device_base: u64,
    ) -> Result<(), ExecError> {
        let step = &plan.steps[s];
        let not_a_copy = || ExecError::Unsupported(format!("step {s} is not a copy"));
        let done = self.events[s].1.as_ref().ok_or_else(not_a_copy)?;
        let device = copied_device_bytes(plan, step).ok_or_else(not_a_copy)?;
        let host = match step.op {
            Op::CopyToHost => step.output,
            Op::CopyToDevice => step.inputs.get(1).copied(),
            _ => step.inputs.first().copied(),
        };
        let host = &plan.buffers[host.ok_or_else(not_a_copy)?.index()];
        let n = host.ty.bytes();
        let (base, len) = self.arena;
        if n > device.end - device.start || host.offset + n > len as u64 {
            return Err(ExecError::Unsupported(format!(
                "step {s} ({}) copies {n} bytes that do not fit its buffers",
                step.op.name()
            )));
        }
        let after = self.order.copy_waits[s];
        let mark = after.and_then(|t| Some((t, self.events[t].0.as_ref()?)));
        match mark {
            Some((t, mark)) if ran(t) => self.copy.wait(mark),
            _ if after.is_none() => Ok(()),
            _ => self.copy.join(compute),
        }
        .map_err(device_error)?;
        let host = (base + host.offset as usize) as *mut std::ffi::c_void;
        let (at, n, stream) = (
            device_base + device.start,
            n as usize,
            self.copy.cu_stream(),
        );
        // SAFETY: the host range was checked to lie inside the page-locked host arena and
        // is passed as a raw address (no reference is made); the host steps touching it run
        // on the same stream, so never during the copy, and reads and writes drain the
        // stream first; the device range is the copied buffer's, inside the arena at
        // `device_base` (the plan verifier placed it).
        unsafe {
            match step.op {
                Op::CopyToHost => sys::cuMemcpyDtoHAsync_v2(host, at, n, stream),
                _ => sys::cuMemcpyHtoDAsync_v2(at, host, n, stream),
            }
        }
        .result()
        .map_err(device_error)?;
        done.record(&self.copy).map_err(device_error)
    }

    /// Makes `compute` wait for the copies step `s` must follow.
    pub(super) fn wait_before(&self, s: usize, compute: &CudaStream) -> Result<(), ExecError> {
        for &c in &self.order.compute_waits[s] {
            if let Some(done) = &self.events[c].1 {
                compute.wait(done).map_err(device_error)?;
            }
        }
        Ok(())
    }

    /// Makes `compute` wait for every copy issued so far (at a micro-step's end).
    pub(super) fn join(&self, compute: &CudaStream) -> Result<(), ExecError> {
        compute.join(&self.copy).map_err(device_error)
    }

    /// Waits on the host for every copy and host step issued so far; the first host step
    /// that failed since the last drain is the error.
    pub(super) fn drain(&self) -> Result<(), ExecError> {
        self.copy.synchronize().map_err(device_error)?;
        match lock(&self.failed)?.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Sets the step number and seed of the host steps issued or launched from now on.
    pub(super) fn set_keys(&self, number: u64, seed: u64) -> Result<(), ExecError> {
        *lock(&self.keys)? = (number, seed);
        Ok(())
    }

    /// Issues host step `s` of micro-step `micro` on the copy stream, after the copies
    /// issued so far and before those issued after it.
    pub(super) fn run(&self, s: usize, micro: u32) -> Result<(), ExecError> {
        let job = self.jobs.get(&(s, micro)).ok_or_else(|| {
            ExecError::Unsupported(format!("step {s} is not a host step of micro-step {micro}"))
        })?;
        fn shared<T: Sync>(job: &T) -> &T {
            job
        }
        // The driver's thread reads the job.
        let data: *const HostJob = shared(&**job);
        // SAFETY: the job stays in place while the tier lives, and the tier outlives every
        // launch of the work issued here (the executor synchronizes at every step's end);
        // `run_host_job` only reads it.
        unsafe {
            result::stream::launch_host_function(
                self.copy.cu_stream(),
                run_host_job,
                data.cast_mut().cast(),
            )
        }
        .map_err(device_error)
    }

    /// The bytes of host buffer `b`, once the copies and host steps are done.
    pub(super) fn read(&self, b: BufferId) -> Result<Vec<u8>, ExecError> {
        self.drain()?;
        Ok(lock(&self.cpu)?.host_bytes(b)?.to_vec())
    }

    /// Overwrites host buffer `b` with `bytes` (its exact size), once the copies and host
    /// steps are done.
    pub(super) fn write(&mut self, b: BufferId, bytes: &[u8]) -> Result<(), ExecError> {
        self.drain()?;
        let mut cpu = lock(&self.cpu)?;
        let into = cpu.host_bytes_mut(b)?;
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

/// One host step of one micro-step, for a host function on the copy stream.
struct HostJob {
    cpu: Arc<Mutex<CpuExecutor>>,
    failed: Arc<Mutex<Option<ExecError>>>,
    keys: Arc<Mutex<(u64, u64)>>,
    step: usize,
    micro: u32,
}

/// The host function of a host step: runs it on the driver's thread, keeping the first
/// failure (a panic included, which must not unwind into the driver) for the next drain.
unsafe extern "C" fn run_host_job(data: *mut std::ffi::c_void) {
    // SAFETY: `data` is a job of the tier, which outlives every launch that calls this.
    let job = unsafe { &*data.cast::<HostJob>() };
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let (number, seed) = *lock(&job.keys)?;
        lock(&job.cpu)?.run_host_step(job.step, (number, seed, job.micro))
    }));
    let failure = match ran {
        Ok(Ok(())) => return,
        Ok(Err(e)) => e,
        Err(_) => ExecError::Device(format!("host step {} panicked", job.step)),
    };
    if let Ok(mut slot) = job.failed.lock() {
        slot.get_or_insert(failure);
    };
}

/// The value behind `m`; a mutex poisoned by a panicking host step is an error.
fn lock<T>(m: &Mutex<T>) -> Result<std::sync::MutexGuard<'_, T>, ExecError> {
    m.lock()
        .map_err(|_| ExecError::Device("a host step panicked earlier".to_string()))
}

impl Drop for HostTier {
    fn drop(&mut self) {
        // Errors cannot be returned from here; the arena is freed with `cpu` either way.
        let _ = self.copy.synchronize();
        // SAFETY: the arena was registered in `new` and nothing is in flight any more.
        let _ = unsafe { sys::cuMemHostUnregister(self.arena.0 as *mut std::ffi::c_void) };
    }
}
