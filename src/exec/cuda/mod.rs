//! The CUDA backend: one device allocation holds the plan's whole arena (managed memory for
//! a plan in unified memory, `arena`); every step launches
//! its generated kernel (an NVRTC CUBIN for the device, or PTX, loaded through the driver
//! API) with the arena base and the byte offsets the plan assigned (a two-stage reduction
//! launches twice; a kernel reading a tensor table gets it copied into its workspace
//! first). Nothing else is allocated on the device, and the
//! host never builds the arena: parameters and state are uploaded one buffer at a time
//! (only the bound inputs stay on the host, every micro-batch of them, page-locked). A
//! step runs as one CUDA Graph (`graph`), or launch by launch while a hook reads
//! gradients, while profiling, or as [`StepMode`] says. An offloaded plan's
//! host arena is page-locked host memory: its copies run on a second stream, overlapping
//! the kernels after them, and its host steps run the CPU kernels on it (`host_tier`).
//!
//! Every entry point checks that the driver library loads before calling into cudarc, whose
//! dynamically loaded symbols panic when it is absent.

mod arena;
mod graph;
mod host_tier;
mod launch;
mod pinned;

use super::cublaslt::Lt;
use super::{ExecError, GradientHook};
use crate::codegen::gemm::Call;
use crate::codegen::{plan_kernel_uses, Kernel};
use crate::plan::{BufferId, Placement, Plan, Target, Tier, VerifiedPlan};
use cudarc::driver::{
    sys::CUevent_flags, CudaContext, CudaEvent, CudaFunction, CudaStream, DriverError,
};
pub use graph::StepMode;
use launch::{image, prepare_calls, Prepared};
use pinned::Pinned;
use std::sync::Arc;

/// True when the CUDA driver library can be loaded on this machine.
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library with libloading; no symbol is called.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

fn device_error(e: DriverError) -> ExecError {
    ExecError::Device(format!("CUDA driver: {e}"))
}

/// Free and total device memory in bytes, from `cuMemGetInfo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemInfo {
    /// Bytes not allocated by anyone.
    pub free: u64,
    /// Bytes of the device.
    pub total: u64,
}

/// What work is issued for: the step number, the micro-step and its dropout stream.
#[derive(Debug, Clone, Copy)]
struct Issue {
    number: u64,
    micro: u32,
    stream: u64,
}

/// Executes a plan on device 0, keeping parameters and optimizer state in the device arena
/// (offloaded optimizer state in the host arena).
pub struct CudaExecutor {
    plan: Plan,
    /// The host arena, its copy stream and host steps (None without `--offload`). Declared
    /// before the arena so that it drops first, waiting for the copies that read it.
    host: Option<host_tier::HostTier>,
    stream: Arc<CudaStream>,
    arena: arena::Arena,
    /// The arena's device address.
    base: u64,
    /// Distinct kernels with their loaded functions (none for library calls alone);
    /// `kernel_of[step]` indexes this list.
    kernels: Vec<(Kernel, Option<CudaFunction>)>,
    kernel_of: Vec<Option<usize>>,
    /// cuBLASLt, opened when some step calls it.
    lt: Option<Lt>,
    /// Per step, its library calls ready to issue (empty for a plain launch).
    calls: Vec<Vec<Prepared>>,
    /// Per step, the tensor table its kernel reads from the start of its workspace (the
    /// plan's offsets are fixed, so it is rendered once and copied before every launch).
    tables: Vec<Option<Pinned>>,
    /// The 1-based number of the next training step.
    step: u64,
    /// The run's seed, which keys its dropout masks ([`Plan::dropout_stream`]).
    seed: u64,
    /// Page-locked copies of the inputs, one micro-batch after another, uploaded at the
    /// start of every micro-step, and how many times an input was bound.
    bound: (Vec<(BufferId, Pinned)>, u64),
    /// The step's graph, and the next step's captured ahead.
    graph: graph::StepGraph,
    /// How steps are issued.
    mode: StepMode,
    /// Why the step stopped running as a CUDA Graph, if it did.
    graph_failure: Option<String>,
    /// The parameters stored quantized, and the error of what was written to them.
    quantized: super::quantized::QuantizedParams,
    /// Device memory just before and just after the arena was allocated.
    pub memory: (MemInfo, MemInfo),
    /// While profiling, the events recorded around each step's work.
    timing: Option<Vec<(usize, CudaEvent, CudaEvent)>>,
}

impl CudaExecutor {
    /// Compiles every kernel of `plan` with NVRTC to a CUBIN for the device's compute
    /// capability (PTX for compute_80 or compute_90 where NVRTC cannot target it), loads
    /// them and allocates the zeroed arena. A plan built for a CUDA target runs only on a
    /// device of at least its compute capability; see [`super::cuda_can_run`] for the rest.
    pub fn new(plan: &VerifiedPlan) -> Result<CudaExecutor, ExecError> {
        super::cuda_can_run(plan.plan(), driver_present())?;
        let plan = plan.plan().clone();
        let ctx = CudaContext::new(0).map_err(device_error)?;
        // SAFETY: the executor orders its two streams itself (`copy_order`), so cudarc's
        // per-allocation events are not needed; they would also break graph capture.
        unsafe { ctx.disable_event_tracking() };
        ctx.bind_to_thread().map_err(device_error)?;
        let (major, minor) = ctx.compute_capability().map_err(device_error)?;
        let arch = match major {
            8 => "compute_80",
            9.. => "compute_90",
            _ => {
                return Err(ExecError::Device(format!(
                    "compute capability {major}.{minor}: the kernels need sm_80 or newer"
                )))
            }
        };
        if let Target::Cuda { sm } = plan.target {
            if (major as u32, minor as u32) < sm {
                return Err(ExecError::Device(format!(
                    "compute capability {major}.{minor}: the plan was built for {}",
                    plan.target
                )));
            }
        }
        let uses = plan_kernel_uses(&plan).map_err(|e| ExecError::Unsupported(e.to_string()))?;
        let mut kernels = Vec::with_capacity(uses.len());
        let mut kernel_of = vec![None; plan.steps.len()];
        for (kernel, steps) in uses {
            let function = if kernel.has_code() {
                let module = ctx
                    .load_module(image(&kernel, (major as u32, minor as u32), arch)?)
                    .map_err(device_error)?;
                Some(module.load_function(&kernel.entry).map_err(device_error)?)
            } else {
                None
            };
            for s in steps {
                kernel_of[s] = Some(kernels.len());
            }
            kernels.push((kernel, function));
        }
        let tables = plan
            .steps
            .iter()
            .zip(&kernel_of)
            .map(|(step, k)| {
                let table = k.and_then(|k| kernels[k].0.table.as_ref())?;
                let bytes = table.bytes(|i| plan.buffers[step.inputs[i].index()].offset);
                Some(Pinned::copy_of(&bytes))
            })
            .map(Option::transpose)
            .collect::<Result<_, _>>()?;
        // Not the legacy default stream, which cannot be captured.
        let stream = ctx.new_stream().map_err(device_error)?;
        let info = |ctx: &CudaContext| {
            ctx.mem_get_info()
                .map_err(device_error)
                .map(|(free, total)| MemInfo {
                    free: free as u64,
                    total: total as u64,
                })
        };
        let before = info(&ctx)?;
        let managed = plan.train.as_ref().is_some_and(|t| t.unified);
        let arena = arena::Arena::zeroed(&ctx, &stream, plan.arena_bytes, managed)?;
        stream.synchronize().map_err(device_error)?;
        let after = info(&ctx)?;
        let base = arena.base(&stream);
        let host = host_tier::HostTier::new(&plan, &ctx)?;
        let lt = match kernels.iter().any(|(k, _)| !k.library.is_empty()) {
            true => {
                ctx.bind_to_thread().map_err(device_error)?;
                Some(Lt::new()?)
            }
            false => None,
        };
        let calls = match &lt {
            Some(lt) => prepare_calls(&plan, &kernels, &kernel_of, lt, base)?,
            None => Vec::new(),
        };
        Ok(CudaExecutor {
            quantized: super::quantized::QuantizedParams::of(&plan),
            plan,
            stream,
            arena,
            base,
            host,
            kernels,
            kernel_of,
            lt,
            calls,
            tables,
            step: 1,
            seed: 0,
            bound: (Vec::new(), 0),
            graph: graph::StepGraph::default(),
            mode: StepMode::from_env(),
            graph_failure: None,
            memory: (before, after),
            timing: None,
        })
    }

    /// The plan being executed.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    fn range(&self, b: BufferId) -> std::ops::Range<usize> {
        let buf = &self.plan.buffers[b.index()];
        buf.offset as usize..(buf.offset + buf.bytes) as usize
    }

    /// Overwrites a buffer with `bytes` (its exact size, in the buffer's element type).
    pub fn write(&mut self, b: BufferId, bytes: &[u8]) -> Result<(), ExecError> {
        let range = self.range(b);
        if bytes.len() != range.len() {
            return Err(ExecError::Shape(format!(
                "`{}` holds {} bytes, got {}",
                self.plan.buffers[b.index()].name,
                range.len(),
                bytes.len()
            )));
        }
        let on_host = self.plan.buffers[b.index()].tier == Tier::Host;
        if let Some(host) = self.host.as_mut().filter(|_| on_host) {
            return host.write(b, bytes);
        }
        self.arena.upload(&self.stream, range.start, bytes)
    }

    /// Writes `values` into a buffer in its element type (16-bit floats rounded to nearest
    /// even, i32 ids as their bit patterns; a quantized weight packed, its error recorded),
    /// exactly as the CPU executor stores them.
    pub fn write_values(&mut self, b: BufferId, values: &[f32]) -> Result<(), ExecError> {
        if let Some(q) = self.quantized.packing(b) {
            let bytes = self.quantized.pack(b, &q, values)?;
            return self.write(b, &bytes);
        }
        let dtype = self.plan.buffers[b.index()].ty.dtype;
        self.write(b, &super::lowp::to_bytes(dtype, values))
    }

    /// A buffer's values as f32 (a quantized weight dequantized), as the CPU executor reads them.
    pub fn read_values(&self, b: BufferId) -> Result<Vec<f32>, ExecError> {
        let bytes = self.read(b)?;
        Ok(match self.quantized.packing(b) {
            Some(q) => crate::ops::quant::pack::unpack(&q, &bytes),
            None => super::lowp::from_bytes(self.plan.buffers[b.index()].ty.dtype, &bytes),
        })
    }

    /// How far the quantized weights written so far lie from the values written (None when
    /// the plan quantizes none or none was written).
    pub fn quantization(&self) -> Option<crate::ops::quant::pack::ErrorSums> {
        self.quantized.errors()
    }

    /// Sets the run's seed, which keys its dropout masks (0 until set).
    pub fn set_seed(&mut self, seed: u64) {
        self.seed = seed;
    }

    /// Sets the 1-based number of the next step (it keys dropout masks and bias correction).
    pub fn set_step_number(&mut self, t: u64) {
        self.step = t.max(1);
    }

    /// Initializes every parameter and persistent-state buffer from [`crate::init::persistent`]
    /// (the values the CPU executor starts from under the same seed), uploading one buffer at
    /// a time, and restarts the step count.
    pub fn init_params(&mut self, seed: u64) -> Result<(), ExecError> {
        let plan = self.plan.clone();
        for (b, values) in crate::init::persistent(&plan, seed, crate::init::RankIndex::FIRST) {
            self.write_values(b, &values)?;
        }
        self.step = 1;
        Ok(())
    }

    /// Binds every input to seeded synthetic data ([`crate::init::synthetic_inputs`]), the
    /// same the CPU executor generates under the same seed.
    pub fn synthetic_inputs(&mut self, seed: u64) -> Result<(), ExecError> {
        let plan = self.plan.clone();
        for (b, values) in crate::init::synthetic_inputs(&plan, seed) {
            self.bind_values(b, &values)?;
        }
        Ok(())
    }

    /// [`CudaExecutor::bind_input`] of `values` in the buffer's element type (as
    /// [`CudaExecutor::write_values`] stores them).
    pub fn bind_values(&mut self, b: BufferId, values: &[f32]) -> Result<(), ExecError> {
        let dtype = self.plan.buffers[b.index()].ty.dtype;
        self.bind_input(b, super::lowp::to_bytes(dtype, values))
    }

    /// Micro-batches per step ([`Plan::micro_steps`]).
    pub fn micro_steps(&self) -> u32 {
        self.plan.micro_steps()
    }

    /// Binds an input for every following step: one micro-batch after another, so
    /// `micro_steps()` times the buffer's bytes.
    pub fn bind_input(&mut self, b: BufferId, bytes: Vec<u8>) -> Result<(), ExecError> {
        let n = self.range(b).len();
        let micro = self.micro_steps() as usize;
        if bytes.len() != n * micro {
            return Err(ExecError::Shape(format!(
                "`{}` takes {micro} micro-batch(es) of {n} bytes, got {}",
                self.plan.buffers[b.index()].name,
                bytes.len()
            )));
        }
        self.write(b, &bytes[..n])?;
        let pinned = Pinned::copy_of(&bytes)?;
        self.bound.0.retain(|(id, _)| *id != b);
        self.bound.0.push((b, pinned));
        self.bound.1 += 1;
        Ok(())
    }

    /// The bytes of a buffer.
    pub fn read(&self, b: BufferId) -> Result<Vec<u8>, ExecError> {
        let on_host = self.plan.buffers[b.index()].tier == Tier::Host;
        if let Some(host) = self.host.as_ref().filter(|_| on_host) {
            return host.read(b);
        }
        self.arena.download(&self.stream, self.range(b))
    }

    /// Runs one training step and waits for the device: every step of the plan on each
    /// micro-batch in turn, the update-phase steps only after the last. `on_gradient` sees
    /// each complete gradient (decoded to f32) just before the update that consumes it; the
    /// device is synchronized for each. Without a hook or profiling, in [`StepMode::Graph`],
    /// the step runs as one CUDA Graph, and the next step's graph is captured while it runs.
    pub fn run_step(&mut self, mut on_gradient: Option<GradientHook>) -> Result<(), ExecError> {
        let number = self.step;
        if let Some(host) = &self.host {
            host.set_keys(number, self.seed)?;
        }
        let graphed = on_gradient.is_none() && self.timing.is_none();
        let ran = graphed
            && self.mode == StepMode::Graph
            && match self.run_graph(number) {
                Ok(()) => true,
                Err(e) => {
                    // Nothing of the step ran; a driver that cannot capture or instantiate
                    // it runs every step launch by launch from now on.
                    self.mode = StepMode::Launches;
                    self.graph_failure = Some(e.to_string());
                    false
                }
            };
        if !ran {
            self.issue_step(number, &mut on_gradient)?;
        }
        self.stream.synchronize().map_err(device_error)?;
        if let Some(host) = &self.host {
            host.drain()?;
        }
        self.step += 1;
        Ok(())
    }

    /// Issues step `number`'s work: each micro-step's inputs copied in, then its steps.
    pub(super) fn issue_step(
        &mut self,
        number: u64,
        on_gradient: &mut Option<GradientHook>,
    ) -> Result<(), ExecError> {
        let micro_steps = self.micro_steps();
        for micro in 0..micro_steps {
            for (b, bytes) in &self.bound.0 {
                let range = self.range(*b);
                let start = micro as usize * range.len();
                let micro_batch = start..start + range.len();
                (self.arena).upload_pinned(&self.stream, range.start, bytes, micro_batch)?;
            }
            let at = Issue {
                number,
                micro,
                stream: self.plan.dropout_stream(self.seed, number, micro),
            };
            self.launch_steps(at, micro + 1 == micro_steps, on_gradient)?;
        }
        Ok(())
    }

    /// Why the steps run launch by launch although graphs were asked for: the error of the
    /// capture or instantiation that failed (None while they run as graphs).
    pub fn graph_failure(&self) -> Option<&str> {
        self.graph_failure.as_deref()
    }

    /// Kernel launches and library calls of one step (every micro-step counted).
    pub fn launches_per_step(&self) -> (u64, u64) {
        let micro = u64::from(self.micro_steps());
        let (mut launches, mut calls) = (0u64, 0u64);
        for (s, step) in self.plan.steps.iter().enumerate() {
            let Some(k) = self.kernel_of[s] else { continue };
            let times = if step.phase == crate::ir::Phase::Update {
                1
            } else {
                micro
            };
            let kernel = &self.kernels[k].0;
            let (l, c) = if kernel.library.is_empty() {
                (1 + u64::from(kernel.finish.is_some()), 0)
            } else {
                let gemms = kernel
                    .library
                    .iter()
                    .filter(|c| matches!(c, Call::Gemm(_)))
                    .count() as u64;
                (kernel.library.len() as u64 - gemms, gemms)
            };
            launches += l * times;
            calls += c * times;
        }
        (launches, calls)
    }

    /// Runs one training step as [`CudaExecutor::run_step`] does, timing each plan step's
    /// device work with CUDA events: (step index, milliseconds), summed over micro-steps.
    pub fn profile_step(&mut self) -> Result<Vec<(usize, f64)>, ExecError> {
        self.timing = Some(Vec::new());
        let ran = self.run_step(None);
        let events = self.timing.take().unwrap_or_default();
        ran?;
        let mut out: Vec<(usize, f64)> = Vec::new();
        for (s, start, end) in events {
            let ms = f64::from(start.elapsed_ms(&end).map_err(device_error)?);
            match out.last_mut() {
                Some((last, total)) if *last == s => *total += ms,
                _ => out.push((s, ms)),
            }
        }
        Ok(out)
    }

    /// Launches every step of a micro-step (update-phase steps only when `last`), showing
    /// `on_gradient` each update's gradient first: kernels on the compute stream, copies
    /// between the tiers and host steps on the copy stream; the compute stream ends
    /// waiting for the copies.
    fn launch_steps(
        &mut self,
        at: Issue,
        last: bool,
        on_gradient: &mut Option<GradientHook>,
    ) -> Result<(), ExecError> {
        // cuBLASLt issues its work in the thread's current context.
        self.stream
            .context()
            .bind_to_thread()
            .map_err(device_error)?;
        if let Some(host) = &self.host {
            host.begin(&self.stream)?;
        }
        for (s, step) in self.plan.steps.iter().enumerate() {
            if !last && step.phase == crate::ir::Phase::Update {
                continue;
            }
            if let Some(hook) = on_gradient.as_mut() {
                for (name, grad) in self.plan.gradients_consumed(step) {
                    let dtype = self.plan.buffers[grad.index()].ty.dtype;
                    hook(name, &super::lowp::from_bytes(dtype, &self.read(grad)?));
                }
            }
            match (self.plan.placement(step), self.host.as_ref()) {
                (Placement::Device, _) => {}
                (Placement::Host, Some(host)) => {
                    host.run(s, at.micro)?;
                    self.settle(s)?;
                    continue;
                }
                (Placement::Transfer, Some(host)) => {
                    let ran =
                        |t: usize| last || self.plan.steps[t].phase != crate::ir::Phase::Update;
                    host.copy(&self.plan, s, (&self.stream, ran), self.base)?;
                    self.settle(s)?;
                    continue;
                }
                (_, None) => {
                    return Err(ExecError::Unsupported(format!(
                        "step {s} ({}) is off the device, but the plan has no host arena",
                        step.op.name()
                    )))
                }
            }
            if let Some(k) = self.kernel_of[s] {
                let timed = self.issue_launch(s, k, at)?;
                if let (Some((start, end)), Some(t)) = (timed, self.timing.as_mut()) {
                    t.push((s, start, end));
                }
                self.settle(s)?;
            }
            // A copy waiting for this step follows it (and, where it launches nothing,
            // what came before it).
            if let Some(host) = &self.host {
                host.issued(s, &self.stream)?;
            }
        }
        match &self.host {
            Some(host) => host.join(&self.stream),
            None => Ok(()),
        }
    }

    /// Issues device step `s` (kernel `k`) as `at` says: after the copies it must follow,
    /// its tensor table uploaded, then its work; while profiling, the events recorded
    /// around it.
    fn issue_launch(
        &self,
        s: usize,
        k: usize,
        at: Issue,
    ) -> Result<Option<(CudaEvent, CudaEvent)>, ExecError> {
        if let Some(host) = &self.host {
            host.wait_before(s, &self.stream)?;
        }
        let start = self.record()?;
        if let Some(table) = &self.tables[s] {
            let to = (self.plan.steps[s].workspace)
                .map_or(0, |b| self.plan.buffers[b.index()].offset) as usize;
            (self.arena).upload_pinned(&self.stream, to, table, 0..table.len())?;
        }
        self.launch_step(s, k, at)?;
        Ok(start.zip(self.record()?))
    }

    /// With `MEMC_CUDA_SYNC=1`, waits for step `s`'s work and names it if it failed.
    fn settle(&self, s: usize) -> Result<(), ExecError> {
        if self.mode != StepMode::Synchronized {
            return Ok(());
        }
        let failed = |e: String| {
            let step = &self.plan.steps[s];
            let kernel = self.kernel_of[s].map(|k| self.kernels[k].0.name.as_str());
            ExecError::Device(format!(
                "step {s} (`{}`{}) failed: {e}",
                step.op.name(),
                kernel
                    .map(|k| format!(", kernel `{k}`"))
                    .unwrap_or_default()
            ))
        };
        self.stream
            .synchronize()
            .map_err(|e| failed(format!("CUDA driver: {e}")))?;
        match &self.host {
            Some(host) => host.drain().map_err(|e| failed(e.to_string())),
            None => Ok(()),
        }
    }

    /// An event recorded on the stream now, while profiling.
    fn record(&self) -> Result<Option<CudaEvent>, ExecError> {
        if self.timing.is_none() {
            return Ok(None);
        }
        let event = self
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(device_error)?;
        Ok(Some(event))
    }
}
