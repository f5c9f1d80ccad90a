//! The CPU reference backend: runs a verified plan inside one arena allocated once, every
//! tensor a view at its planned offset; nothing else is allocated per step except the
//! kernels' O(row) scratch.

use super::quantized::QuantizedParams;
use super::{lowp, ExecError, GradientHook};
use crate::ir::{DType, Op, Phase};
use crate::plan::{Buffer, BufferId, Plan, Step, Tier, VerifiedPlan};
use std::borrow::Cow;

mod host_side;

/// Executes a plan step after step, keeping parameters and optimizer state in the arena.
pub struct CpuExecutor {
    plan: Plan,
    /// The device arena, as f32 words so every 4-byte-aligned view is aligned.
    arena: Vec<f32>,
    /// The host arena (`--offload`), a separate allocation in the same words.
    host: Vec<f32>,
    /// The 1-based number of the next training step (AdamW bias correction, dropout keys).
    step: u64,
    /// The run's seed, which keys its dropout masks ([`Plan::dropout_stream`]).
    seed: u64,
    /// The 0-based micro-step running within the step (gradient accumulation).
    micro: u32,
    /// Host copies of the inputs, one micro-batch after another, rebound at the start of
    /// every micro-step (their arena bytes are reused after their last reader).
    bound: Vec<(BufferId, Vec<f32>)>,
    /// The parameters stored quantized, and the error of what was written to them.
    quantized: QuantizedParams,
    /// This executor's rank and the group of a data-parallel run (None: one rank alone).
    member: Option<(usize, std::sync::Arc<super::group::Group>)>,
    /// This executor's tensor rank and its replica's tensor group (None: no tensor split).
    tensor_member: Option<(usize, std::sync::Arc<super::group::Group>)>,
    /// This executor's pipeline stage and its replica's mailbox (None: no pipeline).
    stage: Option<(u32, std::sync::Arc<super::mailbox::Mailbox>)>,
}

impl CpuExecutor {
    /// Allocates the arena and, for an offloaded plan, the host arena apart from it (both
    /// zeroed) for `plan`. Every dtype runs: 16-bit tensors are stored
    /// as 16-bit words at their planned offsets.
    pub fn new(plan: &VerifiedPlan) -> Result<CpuExecutor, ExecError> {
        Ok(CpuExecutor::with_arenas(plan.plan().clone(), true))
    }

    /// An executor of `plan` with its host arena and, when `device`, its device arena
    /// (both zeroed).
    fn with_arenas(plan: Plan, device: bool) -> CpuExecutor {
        let device_bytes = if device { plan.arena_bytes } else { 0 };
        let [words, host] = [device_bytes, plan.host_bytes].map(|b| b.div_ceil(4) as usize);
        CpuExecutor {
            quantized: QuantizedParams::of(&plan),
            plan,
            arena: vec![0.0; words],
            host: vec![0.0; host],
            step: 1,
            seed: 0,
            micro: 0,
            bound: Vec::new(),
            member: None,
            tensor_member: None,
            stage: None,
        }
    }

    /// Makes this executor rank `rank` of `group`: its collectives meet the other ranks',
    /// its sharded parameters start from their slice of the full initial values.
    pub fn join(&mut self, rank: usize, group: std::sync::Arc<super::group::Group>) {
        self.member = Some((rank, group));
    }

    /// Makes this executor tensor rank `rank` of its replica's `group`: its tensor-parallel
    /// sums meet the other tensor ranks', its split parameters start from their slice.
    pub fn join_tensor(&mut self, rank: usize, group: std::sync::Arc<super::group::Group>) {
        self.tensor_member = Some((rank, group));
    }

    /// Makes this executor pipeline stage `stage` of its replica: its sends and receives go
    /// through `mailbox`, shared with the replica's other stages (of its tensor rank).
    pub fn join_pipeline(&mut self, stage: u32, mailbox: std::sync::Arc<super::mailbox::Mailbox>) {
        self.stage = Some((stage, mailbox));
    }

    /// Sets the run's seed, which keys its dropout masks (0 until set).
    pub fn set_seed(&mut self, seed: u64) {
        self.seed = seed;
    }

    /// Micro-batches per step ([`Plan::micro_steps`]).
    pub fn micro_steps(&self) -> u32 {
        self.plan.micro_steps()
    }

    /// Sets the 1-based number of the next step (it keys dropout masks and bias correction).
    pub fn set_step_number(&mut self, t: u64) {
        self.step = t.max(1);
    }

    /// The plan being executed.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    fn buffer(&self, b: BufferId) -> &Buffer {
        &self.plan.buffers[b.index()]
    }

    /// The arena holding the buffers of `tier`.
    fn memory(&self, tier: Tier) -> &[f32] {
        match tier {
            Tier::Device => &self.arena,
            Tier::Host => &self.host,
        }
    }

    /// The arena holding `b`'s bytes, writable.
    fn memory_mut(&mut self, b: BufferId) -> &mut [f32] {
        match self.plan.buffers[b.index()].tier {
            Tier::Device => &mut self.arena,
            Tier::Host => &mut self.host,
        }
    }

    /// The word range of a 32-bit buffer (of a byte buffer, the words holding its bytes).
    fn range(&self, b: BufferId) -> (usize, usize) {
        let buf = self.buffer(b);
        let start = (buf.offset / 4) as usize;
        (start, start + buf.ty.bytes().div_ceil(4) as usize)
    }

    /// The contents of a buffer as f32 (16-bit tensors decoded exactly; i32 ids as their
    /// bit patterns; a quantized weight dequantized to f32).
    pub fn read(&self, b: BufferId) -> Cow<'_, [f32]> {
        let buf = self.buffer(b);
        if let Some(q) = self.quantized.packing(b) {
            let bytes = narrow_bytes(
                self.memory(buf.tier),
                buf.offset,
                DType::U8,
                buf.ty.numel() as usize,
            );
            Cow::Owned(crate::ops::quant::pack::unpack(&q, bytes))
        } else if is_narrow(buf.ty.dtype) {
            let (dtype, n) = (buf.ty.dtype, buf.ty.numel() as usize);
            Cow::Owned(lowp::from_bytes(
                dtype,
                narrow_bytes(self.memory(buf.tier), buf.offset, dtype, n),
            ))
        } else {
            let (s, e) = self.range(b);
            Cow::Borrowed(&self.memory(buf.tier)[s..e])
        }
    }

    /// Overwrites a buffer's contents (length must match); 16-bit tensors store each value
    /// rounded to nearest even; a quantized weight stores the values packed (and their
    /// quantization error is recorded, [`CpuExecutor::quantization`]).
    pub fn write(&mut self, b: BufferId, data: &[f32]) -> Result<(), ExecError> {
        if let Some(q) = self.quantized.packing(b) {
            let bytes = self.quantized.pack(b, &q, data)?;
            let offset = self.buffer(b).offset;
            narrow_bytes_mut(self.memory_mut(b), offset, DType::U8, bytes.len())
                .copy_from_slice(&bytes);
            return Ok(());
        }
        let buf = self.buffer(b);
        let n = buf.ty.numel() as usize;
        if data.len() != n {
            return Err(ExecError::Shape(format!(
                "`{}` holds {n} elements, got {}",
                buf.name,
                data.len()
            )));
        }
        if is_narrow(buf.ty.dtype) {
            let (dtype, offset) = (buf.ty.dtype, buf.offset);
            narrow_bytes_mut(self.memory_mut(b), offset, dtype, n)
                .copy_from_slice(&lowp::to_bytes(dtype, data));
        } else {
            let (s, e) = self.range(b);
            self.memory_mut(b)[s..e].copy_from_slice(data);
        }
        Ok(())
    }

    /// How far the quantized weights written so far lie from the values written (None when
    /// the plan quantizes none or none was written).
    pub fn quantization(&self) -> Option<crate::ops::quant::pack::ErrorSums> {
        self.quantized.errors()
    }

    /// Binds an input for every following step (float data, or i32 ids as their bit
    /// patterns): one micro-batch after another, so `micro_steps()` times the buffer's
    /// elements.
    pub fn bind_input(&mut self, b: BufferId, words: Vec<f32>) -> Result<(), ExecError> {
        let n = self.buffer(b).ty.numel() as usize;
        let micro = self.micro_steps() as usize;
        if words.len() != n * micro {
            return Err(ExecError::Shape(format!(
                "`{}` takes {micro} micro-batch(es) of {n} elements, got {}",
                self.buffer(b).name,
                words.len()
            )));
        }
        self.write(b, &words[..n])?;
        self.bound.retain(|(id, _)| *id != b);
        self.bound.push((b, words));
        Ok(())
    }

    /// The data bound to input `b`, every micro-batch of a step one after another.
    pub fn bound(&self, b: BufferId) -> Option<&[f32]> {
        self.bound
            .iter()
            .find(|(id, _)| *id == b)
            .map(|(_, words)| words.as_slice())
    }

    /// Binds an i32 input for every following step.
    pub fn bind_ids(&mut self, b: BufferId, ids: &[i32]) -> Result<(), ExecError> {
        self.bind_input(b, ids.iter().map(|&i| f32::from_bits(i as u32)).collect())
    }

    /// Initializes every parameter from its initializer, keyed by `seed` and its position,
    /// and sets the persistent state (moments, loss scale) to its initial value.
    pub fn init_params(&mut self, seed: u64) -> Result<(), ExecError> {
        let plan = self.plan.clone();
        let rank = crate::init::RankIndex {
            data: self.member.as_ref().map_or(0, |m| m.0),
            tensor: self.tensor_member.as_ref().map_or(0, |m| m.0),
        };
        for (b, values) in crate::init::persistent(&plan, seed, rank) {
            self.write(b, &values)?;
        }
        self.step = 1;
        Ok(())
    }
    /// Fills every input with seeded synthetic data (every micro-batch of a step): ids
    /// uniform below their limit, floats standard normal.
    pub fn synthetic_inputs(&mut self, seed: u64) -> Result<(), ExecError> {
        let plan = self.plan.clone();
        for (b, words) in crate::init::synthetic_inputs(&plan, seed) {
            self.bind_input(b, words)?;
        }
        Ok(())
    }

    /// The value of the named output after a step (the loss is a 1-element output).
    pub fn output(&self, name: &str) -> Option<Cow<'_, [f32]>> {
        self.plan
            .outputs
            .iter()
            .find(|(n, _)| n == name)
            .map(|&(_, b)| self.read(b))
    }

    /// Runs one training step: every step of the plan on each micro-batch in turn, the
    /// update-phase steps only after the last. `on_gradient` sees each complete gradient
    /// just before the update that consumes it. With accumulation the `loss` output is
    /// the mean over the micro-batches.
    pub fn run_step(&mut self, mut on_gradient: Option<GradientHook>) -> Result<(), ExecError> {
        let steps = std::mem::take(&mut self.plan.steps);
        let micro_steps = self.micro_steps();
        let mut loss_sum = 0.0f64;
        let mut result = Ok(());
        for micro in 0..micro_steps {
            self.micro = micro;
            let last = micro + 1 == micro_steps;
            let run = steps.iter().filter(|s| last || s.phase != Phase::Update);
            result = self
                .rebind(micro)
                .and_then(|()| self.run_steps(run, &mut on_gradient));
            if result.is_err() {
                break;
            }
            loss_sum += self.output("loss").map_or(0.0, |l| f64::from(l[0]));
        }
        self.plan.steps = steps;
        self.micro = 0;
        self.step += 1;
        let loss = self.plan.outputs.iter().find(|(n, _)| n == "loss");
        if let (Ok(()), true, Some(&(_, b))) = (&result, micro_steps > 1, loss) {
            result = self.write(b, &[(loss_sum / f64::from(micro_steps)) as f32]);
        }
        result
    }

    /// Writes micro-batch `micro` of every bound input into its buffer.
    fn rebind(&mut self, micro: u32) -> Result<(), ExecError> {
        for (b, words) in std::mem::take(&mut self.bound) {
            let n = self.buffer(b).ty.numel() as usize;
            let start = micro as usize * n;
            self.write(b, &words[start..start + n])?;
            self.bound.push((b, words));
        }
        Ok(())
    }

    fn run_steps<'s>(
        &mut self,
        steps: impl Iterator<Item = &'s Step>,
        on_gradient: &mut Option<GradientHook>,
    ) -> Result<(), ExecError> {
        for step in steps {
            if let Some(hook) = on_gradient.as_mut() {
                for (name, grad) in self.plan.gradients_consumed(step) {
                    hook(name, &self.read(grad));
                }
            }
            if !self.plan.launches(step) {
                continue;
            }
            let views = self.views(step);
            self.execute(step, &views)?;
            views.write_back();
        }
        Ok(())
    }

    /// Views of one step's buffers. 32-bit buffers are viewed in place; 16-bit ones are
    /// decoded into staging copies, and the copies of what the kernel writes (its output,
    /// in-place updates) are encoded back by [`Views::write_back`], so every kernel computes
    /// in f32 and rounds once per store, as the CUDA kernels do. The plan verifier guarantees that buffers live at the same step
    /// never share bytes, so the output, workspace and in-place inputs are disjoint from every
    /// other view taken here.
    fn views(&mut self, step: &Step) -> Views {
        let (device, host) = (self.arena.as_mut_ptr(), self.host.as_mut_ptr());
        let base = |tier: Tier| match tier {
            Tier::Device => device,
            Tier::Host => host,
        };
        let mut staged = Vec::new();
        let mut slot = |buf: &Buffer| {
            let len = buf.ty.numel() as usize;
            if !is_narrow(buf.ty.dtype) {
                // SAFETY: the plan verifier checked every buffer ends within its tier's
                // arena (`arena_bytes`, `host_bytes`), and each allocation holds that many.
                return (
                    unsafe { base(buf.tier).add((buf.offset / 4) as usize) },
                    len,
                );
            }
            let bytes = narrow_bytes(self.memory(buf.tier), buf.offset, buf.ty.dtype, len);
            let mut copy = lowp::from_bytes(buf.ty.dtype, bytes);
            let ptr = copy.as_mut_ptr();
            staged.push(copy);
            (ptr, len)
        };
        let buffers = &self.plan.buffers;
        let inputs: Vec<_> = step
            .inputs
            .iter()
            .map(|&b| slot(&buffers[b.index()]))
            .collect();
        let output = step.output.map(|b| slot(&buffers[b.index()]));
        let workspace = step.workspace.map(|b| slot(&buffers[b.index()]));
        // The output and the inputs an update writes in place, paired with their slots.
        let written = step
            .op
            .mutated_inputs()
            .iter()
            .map(|&i| (step.inputs[i], inputs[i]))
            .chain(step.output.zip(output));
        let write_back = written
            .filter(|(b, _)| is_narrow(buffers[b.index()].ty.dtype))
            .map(|(b, slot)| {
                let buf = &buffers[b.index()];
                // SAFETY: as above: the buffer's bytes lie inside its tier's arena.
                let ptr = unsafe { base(buf.tier).cast::<u8>().add(buf.offset as usize) };
                (ptr, buf.ty.dtype, slot)
            })
            .collect();
        Views {
            inputs,
            output,
            workspace,
            _staged: staged,
            write_back,
        }
    }

    fn execute(&self, step: &Step, views: &Views) -> Result<(), ExecError> {
        let args = CpuStep {
            exec: self,
            step,
            views,
        };
        crate::ops::family(&step.op).run_cpu(&args)
    }
}

/// Views of one step's buffers in the arena (narrow ones, 16-bit floats and u8 codes, through
/// f32 staging copies): each slot is `(pointer, elements)` into the arena or into a staging
/// copy of a narrow tensor.
struct Views {
    inputs: Vec<(*mut f32, usize)>,
    output: Option<(*mut f32, usize)>,
    workspace: Option<(*mut f32, usize)>,
    /// Decoded copies of the narrow tensors; the slots above point into them (their heap
    /// storage does not move while `Views` lives).
    _staged: Vec<Vec<f32>>,
    /// Where the staging copies of narrow buffers the kernel writes (its output, in-place
    /// updates) are encoded back after it runs.
    write_back: Vec<(*mut u8, DType, (*mut f32, usize))>,
}

impl Views {
    fn slice<'a>(&self, (ptr, len): (*mut f32, usize)) -> &'a [f32] {
        // SAFETY: the slot lies inside the arena or a staging copy, both of which outlive
        // the step.
        unsafe { std::slice::from_raw_parts(ptr, len) }
    }

    #[allow(clippy::mut_from_ref)]
    fn slice_mut<'a>(&self, (ptr, len): (*mut f32, usize)) -> &'a mut [f32] {
        // SAFETY: as in `slice`; additionally the verifier guarantees that buffers live at
        // the same step are disjoint, and each mutable range (output, workspace, in-place
        // update inputs) is requested once per step, so no other view aliases it.
        unsafe { std::slice::from_raw_parts_mut(ptr, len) }
    }

    fn input<'a>(&self, i: usize) -> &'a [f32] {
        self.slice(self.inputs[i])
    }

    fn input_mut<'a>(&self, i: usize) -> &'a mut [f32] {
        self.slice_mut(self.inputs[i])
    }

    fn ids<'a>(&self, i: usize) -> &'a [i32] {
        let (ptr, len) = self.inputs[i];
        // SAFETY: as in `slice`; i32 buffers are 32-bit and viewed in place, i32 and f32
        // have the same size and alignment, and ids are stored as their bit patterns.
        unsafe { std::slice::from_raw_parts(ptr as *const i32, len) }
    }

    fn output<'a>(&self) -> &'a mut [f32] {
        self.slice_mut(
            self.output
                .unwrap_or((std::ptr::NonNull::dangling().as_ptr(), 0)),
        )
    }

    fn workspace<'a>(&self) -> &'a mut [f32] {
        self.slice_mut(
            self.workspace
                .unwrap_or((std::ptr::NonNull::dangling().as_ptr(), 0)),
        )
    }

    /// Encodes the staging copies of written narrow buffers into their arena bytes.
    fn write_back(self) {
        for &(dst, dtype, (src, len)) in &self.write_back {
            let encoded = lowp::to_bytes(dtype, self.slice((src, len)));
            // SAFETY: `dst` addresses the buffer's bytes (`len` elements of `dtype`) inside
            // the arena, which no other live view aliases.
            let bytes = unsafe { std::slice::from_raw_parts_mut(dst, encoded.len()) };
            bytes.copy_from_slice(&encoded);
        }
    }
}

/// What a CPU kernel sees of the step it runs: the op, the types of its buffers, f32 views
/// of them in the arena, and the executor's position in training (step, micro-step).
pub struct CpuStep<'a> {
    exec: &'a CpuExecutor,
    step: &'a Step,
    views: &'a Views,
}

impl<'a> CpuStep<'a> {
    /// The op the step runs.
    pub fn op(&self) -> &'a Op {
        &self.step.op
    }

    /// How many inputs the step reads.
    pub fn input_count(&self) -> usize {
        self.step.inputs.len()
    }

    /// The shape of input `i`.
    pub fn shape(&self, i: usize) -> &'a [usize] {
        &self.exec.buffer(self.step.inputs[i]).ty.shape
    }

    /// The element type input `i` is stored in (its values arrive decoded to f32).
    pub fn dtype(&self, i: usize) -> crate::ir::DType {
        self.exec.buffer(self.step.inputs[i]).ty.dtype
    }

    /// The shape of the output (empty when the step has none).
    pub fn out_shape(&self) -> &'a [usize] {
        match self.step.output {
            Some(b) => &self.exec.buffer(b).ty.shape,
            None => &[],
        }
    }

    /// Input `i` as f32 values (16-bit tensors decoded).
    pub fn input(&self, i: usize) -> &'a [f32] {
        self.views.input(i)
    }

    /// Input `i`, writable: only for the inputs the op updates in place
    /// ([`Op::mutated_inputs`]), each requested once per step; nothing else views it.
    pub fn input_mut(&self, i: usize) -> &'a mut [f32] {
        self.views.input_mut(i)
    }

    /// Input `i` as i32 ids (a 32-bit buffer holding their bit patterns).
    pub fn ids(&self, i: usize) -> &'a [i32] {
        self.views.ids(i)
    }

    /// Input `i` as the bytes of a `u8` buffer (a quantized weight's packed bytes; the
    /// step's view stages each byte as its value).
    pub fn bytes(&self, i: usize) -> Vec<u8> {
        self.views.input(i).iter().map(|&v| v as u8).collect()
    }

    /// The output, writable (empty when the step has none); request it once per step.
    pub fn output(&self) -> &'a mut [f32] {
        self.views.output()
    }

    /// The step's workspace, writable (empty when it has none); request it once per step.
    pub fn workspace(&self) -> &'a mut [f32] {
        self.views.workspace()
    }

    /// This step's rank and its group in a data-parallel run (None: one rank alone).
    pub fn member(&self) -> Option<(usize, &'a super::group::Group)> {
        self.exec.member.as_ref().map(|(r, g)| (*r, g.as_ref()))
    }

    /// This step's tensor rank and its replica's tensor group (None: no tensor split).
    pub fn tensor_member(&self) -> Option<(usize, &'a super::group::Group)> {
        (self.exec.tensor_member.as_ref()).map(|(r, g)| (*r, g.as_ref()))
    }

    /// This step's pipeline stage and its replica's mailbox (None: no pipeline).
    pub fn pipeline_member(&self) -> Option<(u32, &'a super::mailbox::Mailbox)> {
        (self.exec.stage.as_ref()).map(|(s, m)| (*s, m.as_ref()))
    }

    /// The 1-based number of the training step running (AdamW bias correction).
    pub fn step_number(&self) -> u64 {
        self.exec.step
    }

    /// The 0-based micro-step running within the step (gradient accumulation).
    pub fn micro_step(&self) -> u32 {
        self.exec.micro
    }

    /// The counter that keys dropout masks in this micro-step ([`Plan::dropout_stream`]).
    pub fn dropout_stream(&self) -> u64 {
        self.exec
            .plan
            .dropout_stream(self.exec.seed, self.exec.step, self.exec.micro)
    }
}

/// Whether buffers of `dtype` are staged through f32 copies (16-bit floats, u8 codes).
fn is_narrow(dtype: DType) -> bool {
    dtype.size() < 4
}

/// The bytes of `len` elements of narrow `dtype` at byte `offset` of the arena.
fn narrow_bytes(arena: &[f32], offset: u64, dtype: DType, len: usize) -> &[u8] {
    let end = assert_in_arena(arena, offset, dtype, len);
    // SAFETY: the range lies inside the arena (checked above); bytes need no alignment.
    unsafe {
        &std::slice::from_raw_parts(arena.as_ptr().cast::<u8>(), 4 * arena.len())
            [offset as usize..end]
    }
}

/// The bytes of `len` elements of narrow `dtype` at byte `offset` of the arena, writable.
fn narrow_bytes_mut(arena: &mut [f32], offset: u64, dtype: DType, len: usize) -> &mut [u8] {
    let end = assert_in_arena(arena, offset, dtype, len);
    // SAFETY: as in `narrow_bytes`, and the slice borrows the arena mutably.
    unsafe {
        &mut std::slice::from_raw_parts_mut(arena.as_mut_ptr().cast::<u8>(), 4 * arena.len())
            [offset as usize..end]
    }
}

/// The end byte of `len` elements of `dtype` at `offset`, checked to lie inside the arena.
fn assert_in_arena(arena: &[f32], offset: u64, dtype: DType, len: usize) -> usize {
    let end = offset as usize + dtype.size() as usize * len;
    assert!(
        offset.is_multiple_of(dtype.size()) && end <= 4 * arena.len(),
        "narrow view {offset}..{end} outside the arena (the plan verifier admits no such plan)"
    );
    end
}
