//! The CPU reference backend: runs a verified plan inside one arena allocated once, every
//! tensor a view at its planned offset; nothing else is allocated per step except the
//! kernels' O(row) scratch.

use super::kernels::{dense, loss, movement, norm, optim, pointwise, reduce, rng};
use super::ExecError;
use crate::ir::{AttnParams, DType, Init, Op, PoolParams};
use crate::plan::{Buffer, BufferId, Plan, Step, VerifiedPlan};

/// Executes a plan step after step, keeping parameters and optimizer state in the arena.
pub struct CpuExecutor {
    plan: Plan,
    /// The arena, as f32 words so every 4-byte-aligned view is aligned.
    arena: Vec<f32>,
    /// The 1-based number of the next training step (AdamW bias correction, dropout keys).
    step: u64,
    /// Host copies of the inputs, rebound at the start of every step (their arena bytes are
    /// reused after their last reader).
    bound: Vec<(BufferId, Vec<f32>)>,
}

/// Called before each update with the parameter name and its complete gradient.
pub type GradientHook<'a> = &'a mut dyn FnMut(&str, &[f32]);

fn shape(plan: &Plan, b: BufferId) -> &[usize] {
    &plan.buffers[b.index()].ty.shape
}

fn pool_geom(p: &PoolParams, x: &[usize]) -> dense::Pool2dGeom {
    dense::Pool2dGeom {
        n: x[0],
        c: x[1],
        h: x[2],
        w: x[3],
        kernel: p.kernel,
        stride: p.stride,
        padding: p.padding,
    }
}

fn attn_geom(a: &AttnParams, q: &[usize], k: &[usize]) -> dense::AttnGeom {
    dense::AttnGeom {
        b: q[0],
        t_q: q[1],
        t_k: k[1],
        heads: a.heads,
        kv_heads: a.kv_heads,
        head_dim: q[2] / a.heads.max(1),
        causal: a.causal,
        scale: a.scale,
    }
}

fn index_error(e: loss::IndexOutOfRange) -> ExecError {
    ExecError::IdOutOfRange {
        value: e.value,
        limit: e.limit,
    }
}

impl CpuExecutor {
    /// Allocates the arena (zeroed) for `plan`. Only f32 and i32 buffers run on the CPU.
    pub fn new(plan: &VerifiedPlan) -> Result<CpuExecutor, ExecError> {
        let plan = plan.plan().clone();
        if let Some(b) = plan
            .buffers
            .iter()
            .find(|b| !matches!(b.ty.dtype, DType::F32 | DType::I32))
        {
            return Err(ExecError::Unsupported(format!(
                "buffer `{}` is {}; the CPU backend runs f32 plans",
                b.name, b.ty
            )));
        }
        let words = plan.arena_bytes.div_ceil(4) as usize;
        Ok(CpuExecutor {
            plan,
            arena: vec![0.0; words],
            step: 1,
            bound: Vec::new(),
        })
    }

    /// Sets the 1-based number of the next step (it keys dropout masks and bias correction).
    pub fn set_step_number(&mut self, t: u64) {
        self.step = t.max(1);
    }

    /// The plan being executed.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    fn range(&self, b: BufferId) -> (usize, usize) {
        let buf: &Buffer = &self.plan.buffers[b.index()];
        let start = (buf.offset / 4) as usize;
        (start, start + buf.ty.numel() as usize)
    }

    /// The f32 contents of a buffer.
    pub fn read(&self, b: BufferId) -> &[f32] {
        let (s, e) = self.range(b);
        &self.arena[s..e]
    }

    /// Overwrites a buffer's contents (length must match).
    pub fn write(&mut self, b: BufferId, data: &[f32]) -> Result<(), ExecError> {
        let (s, e) = self.range(b);
        if data.len() != e - s {
            return Err(ExecError::Shape(format!(
                "`{}` holds {} elements, got {}",
                self.plan.buffers[b.index()].name,
                e - s,
                data.len()
            )));
        }
        self.arena[s..e].copy_from_slice(data);
        Ok(())
    }

    /// Binds an input for every following step (f32 data, or i32 ids as their bit patterns).
    pub fn bind_input(&mut self, b: BufferId, words: Vec<f32>) -> Result<(), ExecError> {
        self.write(b, &words)?;
        self.bound.retain(|(id, _)| *id != b);
        self.bound.push((b, words));
        Ok(())
    }

    /// Binds an i32 input for every following step.
    pub fn bind_ids(&mut self, b: BufferId, ids: &[i32]) -> Result<(), ExecError> {
        self.bind_input(b, ids.iter().map(|&i| f32::from_bits(i as u32)).collect())
    }

    /// Initializes every parameter from its initializer, keyed by `seed` and its position,
    /// and zeroes the optimizer state.
    pub fn init_params(&mut self, seed: u64) {
        for (k, p) in self.plan.params.clone().iter().enumerate() {
            let (s, e) = self.range(p.buffer);
            let key = seed.wrapping_mul(1_000_003).wrapping_add(k as u64);
            for (i, x) in self.arena[s..e].iter_mut().enumerate() {
                *x = match p.init {
                    Init::Zeros => 0.0,
                    Init::Ones => 1.0,
                    Init::Normal { std } => rng::normal01(key, 0, i as u64) * std,
                    Init::Uniform { low, high } => {
                        low + (high - low) * rng::uniform01(key, 0, i as u64)
                    }
                };
            }
        }
        for b in self.plan.optim_state.clone() {
            let (s, e) = self.range(b);
            self.arena[s..e].fill(0.0);
        }
        self.step = 1;
    }

    /// Fills every input with seeded synthetic data: ids uniform below their limit, floats
    /// standard normal.
    pub fn synthetic_inputs(&mut self, seed: u64) -> Result<(), ExecError> {
        for (k, input) in self.plan.inputs.clone().iter().enumerate() {
            let n = self.plan.buffers[input.buffer.index()].ty.numel() as usize;
            let key = seed ^ (0x5151_0000 + k as u64);
            match self.plan.buffers[input.buffer.index()].ty.dtype {
                DType::I32 => {
                    let limit = input.id_limit.unwrap_or(2) as f32;
                    let ids: Vec<i32> = (0..n)
                        .map(|i| {
                            ((rng::uniform01(key, 0, i as u64) * limit) as i32)
                                .min(limit as i32 - 1)
                        })
                        .collect();
                    self.bind_ids(input.buffer, &ids)?;
                }
                _ => {
                    let xs: Vec<f32> = (0..n).map(|i| rng::normal01(key, 0, i as u64)).collect();
                    self.bind_input(input.buffer, xs)?;
                }
            }
        }
        Ok(())
    }

    /// The value of the named output after a step (the loss is a 1-element output).
    pub fn output(&self, name: &str) -> Option<&[f32]> {
        self.plan
            .outputs
            .iter()
            .find(|(n, _)| n == name)
            .map(|&(_, b)| self.read(b))
    }

    /// Runs every step of the plan once; `on_gradient` sees each complete gradient just
    /// before the update that consumes it.
    pub fn run_step(&mut self, mut on_gradient: Option<GradientHook>) -> Result<(), ExecError> {
        for (b, words) in std::mem::take(&mut self.bound) {
            let (s, e) = self.range(b);
            self.arena[s..e].copy_from_slice(&words);
            self.bound.push((b, words));
        }
        let steps = std::mem::take(&mut self.plan.steps);
        let result = steps.iter().try_for_each(|step| {
            if let (Some(hook), Op::AdamW(_) | Op::Sgd(_)) = (on_gradient.as_mut(), &step.op) {
                if let Some(p) = self.plan.params.iter().find(|p| p.buffer == step.inputs[0]) {
                    hook(&p.name, self.read(step.inputs[1]));
                }
            }
            self.execute(step)
        });
        self.plan.steps = steps;
        self.step += 1;
        result
    }

    /// Raw views into the arena for one step. The plan verifier guarantees that buffers live
    /// at the same step never share bytes, so the output, workspace and in-place inputs are
    /// disjoint from every other view taken here.
    fn views(&mut self, step: &Step) -> Views {
        let base = self.arena.as_mut_ptr();
        let span = |b: BufferId| {
            let buf = &self.plan.buffers[b.index()];
            ((buf.offset / 4) as usize, buf.ty.numel() as usize)
        };
        Views {
            base,
            inputs: step.inputs.iter().map(|&b| span(b)).collect(),
            output: step.output.map(span),
            workspace: step.workspace.map(span),
        }
    }

    fn execute(&mut self, step: &Step) -> Result<(), ExecError> {
        let v = self.views(step);
        let plan = &self.plan;
        let s = |i: usize| shape(plan, step.inputs[i]);
        let out_shape: &[usize] = step.output.map(|b| shape(plan, b)).unwrap_or(&[]);
        let x = |i: usize| v.input(i);
        let out = || v.output();
        use Op::*;
        match &step.op {
            Input { .. } | Param { .. } | OptimState { .. } => {
                return Err(ExecError::Unsupported(format!(
                    "`{}` is not a step",
                    step.op.name()
                )))
            }
            Fill { value, .. } => pointwise::fill(out(), *value),
            Unary(f) => pointwise::unary_forward(*f, x(0), out()),
            UnaryBackward(f) => pointwise::unary_backward(*f, x(0), x(1), out()),
            Binary(f) => pointwise::binary(*f, x(0), s(0), x(1), s(1), out(), out_shape),
            Affine { scale, shift } => pointwise::affine(x(0), *scale, *shift, out()),
            SumTo { shape } => reduce::sum_to(x(0), s(0), out(), shape),
            BroadcastTo { shape } => reduce::broadcast_to(x(0), s(0), out(), shape),
            MaxTo { shape } => reduce::max_to(x(0), s(0), out(), shape),
            MaxToBackward => reduce::max_to_backward(x(0), s(0), x(1), x(2), out(), s(1)),
            Softmax { axis } => reduce::softmax(x(0), s(0), *axis, out()),
            SoftmaxBackward { axis } => reduce::softmax_backward(x(0), x(1), s(0), *axis, out()),
            LogSoftmax { axis } => reduce::log_softmax(x(0), s(0), *axis, out()),
            LogSoftmaxBackward { axis } => {
                reduce::log_softmax_backward(x(0), x(1), s(0), *axis, out())
            }
            Norm { kind, eps } => {
                let bias = (step.inputs.len() > 2).then(|| x(2));
                norm::norm_forward(*kind, *eps, x(0), s(0), x(1), bias, out())
            }
            NormBackwardInput { kind, eps } => {
                norm::norm_backward_input(*kind, *eps, x(0), s(0), x(1), x(2), out())
            }
            NormBackwardWeight { kind, eps } => {
                norm::norm_backward_weight(*kind, *eps, x(0), s(0), x(1), out())
            }
            NormBackwardBias { kind } => norm::norm_backward_bias(*kind, x(0), s(0), out()),
            Embedding => loss::embedding(x(0), s(0)[1], v.ids(1), out()).map_err(index_error)?,
            EmbeddingBackward { .. } => {
                let d = out_shape.get(1).copied().unwrap_or(1);
                loss::embedding_backward(v.ids(0), x(1), d, out()).map_err(index_error)?
            }
            CrossEntropy => {
                let c = s(0).last().copied().unwrap_or(1);
                loss::cross_entropy(x(0), c, v.ids(1), out()).map_err(index_error)?
            }
            CrossEntropyBackward => {
                let c = s(0).last().copied().unwrap_or(1);
                loss::cross_entropy_backward(x(0), c, v.ids(1), x(2)[0], out())
                    .map_err(index_error)?
            }
            Mse => loss::mse(x(0), x(1), out()),
            MseBackward => loss::mse_backward(x(0), x(1), x(2)[0], out()),
            Reshape { .. } => out().copy_from_slice(x(0)),
            Permute { perm } => movement::permute(x(0), s(0), perm, out()),
            Slice { axis, start, end } => movement::slice(x(0), s(0), *axis, *start, *end, out()),
            PadSlice { axis, start, full } => {
                movement::pad_slice(x(0), s(0), *axis, *start, *full, out())
            }
            Concat { axis } => {
                let parts: Vec<(&[f32], &[usize])> =
                    (0..step.inputs.len()).map(|i| (x(i), s(i))).collect();
                movement::concat(&parts, *axis, out())
            }
            MatMul { ta, tb } => dense::matmul(x(0), s(0), *ta, x(1), s(1), *tb, out(), out_shape),
            Conv2d(c) => dense::conv2d_forward(
                &super::kernels::conv_geom(c, s(0), s(1)),
                x(0),
                x(1),
                out(),
                v.workspace(),
            ),
            Conv2dBackwardInput { conv, .. } => dense::conv2d_backward_input(
                &super::kernels::conv_geom(conv, out_shape, s(1)),
                x(0),
                x(1),
                out(),
                v.workspace(),
            ),
            Conv2dBackwardWeight { conv, .. } => dense::conv2d_backward_weight(
                &super::kernels::conv_geom(conv, s(0), out_shape),
                x(0),
                x(1),
                out(),
                v.workspace(),
            ),
            MaxPool2d(p) => dense::max_pool2d_forward(&pool_geom(p, s(0)), x(0), out()),
            MaxPool2dBackward(p) => {
                dense::max_pool2d_backward(&pool_geom(p, s(0)), x(0), x(1), out())
            }
            AvgPool2d(p) => dense::avg_pool2d_forward(&pool_geom(p, s(0)), x(0), out()),
            AvgPool2dBackward { pool, .. } => {
                dense::avg_pool2d_backward(&pool_geom(pool, out_shape), x(0), out())
            }
            Dropout { p, seed } => rng::dropout(x(0), *p, *seed, self.step, out()),
            Attention(a) => {
                dense::attention_forward(&attn_geom(a, s(0), s(1)), x(0), x(1), x(2), out())
            }
            AttentionBackward { attn, which } => dense::attention_backward(
                &attn_geom(attn, s(0), s(1)),
                x(0),
                x(1),
                x(2),
                x(3),
                *which,
                out(),
            ),
            Rope {
                heads,
                base,
                inverse,
            } => {
                let sh = s(0);
                dense::rope(
                    x(0),
                    sh[0],
                    sh[1],
                    *heads,
                    sh[2] / heads.max(&1),
                    *base,
                    *inverse,
                    out(),
                )
            }
            ClipCoefficient { max_norm } => {
                let total: f64 = (0..step.inputs.len())
                    .map(|i| optim::sum_squares(x(i)))
                    .sum();
                out()[0] = (*max_norm as f64 / (total.sqrt() + 1e-6)).min(1.0) as f32;
            }
            AdamW(p) => {
                let clip = if step.inputs.len() > 4 { x(4)[0] } else { 1.0 };
                optim::adamw_update(
                    v.input_mut(0),
                    x(1),
                    v.input_mut(2),
                    v.input_mut(3),
                    p.lr,
                    p.beta1,
                    p.beta2,
                    p.eps,
                    p.weight_decay,
                    self.step,
                    clip,
                )
            }
            Sgd(p) => {
                let clip = if step.inputs.len() > 3 { x(3)[0] } else { 1.0 };
                optim::sgd_update(
                    v.input_mut(0),
                    x(1),
                    v.input_mut(2),
                    p.lr,
                    p.momentum,
                    p.weight_decay,
                    self.step,
                    clip,
                )
            }
        }
        Ok(())
    }
}

/// Word ranges of one step's buffers inside the arena, handed out as slices.
struct Views {
    base: *mut f32,
    inputs: Vec<(usize, usize)>,
    output: Option<(usize, usize)>,
    workspace: Option<(usize, usize)>,
}

impl Views {
    fn slice<'a>(&self, (start, len): (usize, usize)) -> &'a [f32] {
        // SAFETY: the range lies inside the arena (the plan verifier checked every buffer
        // ends within `arena_bytes`, and the arena holds that many bytes), and the arena
        // outlives the step.
        unsafe { std::slice::from_raw_parts(self.base.add(start), len) }
    }

    #[allow(clippy::mut_from_ref)]
    fn slice_mut<'a>(&self, (start, len): (usize, usize)) -> &'a mut [f32] {
        // SAFETY: as in `slice`; additionally the verifier guarantees that buffers live at
        // the same step are disjoint, and each mutable range (output, workspace, in-place
        // update inputs) is requested once per step, so no other view aliases it.
        unsafe { std::slice::from_raw_parts_mut(self.base.add(start), len) }
    }

    fn input<'a>(&self, i: usize) -> &'a [f32] {
        self.slice(self.inputs[i])
    }

    fn input_mut<'a>(&self, i: usize) -> &'a mut [f32] {
        self.slice_mut(self.inputs[i])
    }

    fn ids<'a>(&self, i: usize) -> &'a [i32] {
        let (start, len) = self.inputs[i];
        // SAFETY: as in `slice`; i32 and f32 have the same size and alignment, and ids are
        // stored as their bit patterns.
        unsafe { std::slice::from_raw_parts(self.base.add(start) as *const i32, len) }
    }

    fn output<'a>(&self) -> &'a mut [f32] {
        self.slice_mut(self.output.unwrap_or((0, 0)))
    }

    fn workspace<'a>(&self) -> &'a mut [f32] {
        self.slice_mut(self.workspace.unwrap_or((0, 0)))
    }
}
