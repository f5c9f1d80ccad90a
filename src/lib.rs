//! memc: compiles a `.mdl` model spec into a memory-planned training or inference step.
//!
//! [`compile`] runs the pipeline: parse, lower, loss-head fusion, mixed precision, autodiff, optimizer, checkpointing chosen to
//! fit the budget, schedule, liveness, arena layout, plan verification. Each stage is a pure
//! function of the previous one.
pub mod advise;
pub mod arena_csv;
pub mod bench;
pub mod budget;
pub mod codegen;
pub mod cost;
pub mod diagnostic;
pub mod exec;
pub mod fit;
pub mod fit_ranks;
pub mod front;
pub mod hf;
pub mod init;
pub mod ir;
mod joint;
mod launch_groups;
pub mod onnx;
pub mod ops;
pub mod parallel;
pub mod passes;
pub mod plan;
pub mod settings;
mod stages;
pub mod tiling;
pub mod viz;

use diagnostic::UserError;
pub use joint::{compile_or_offload, OFFLOAD_KNOBS};
use plan::{BuildOptions, VerifiedPlan};
use std::time::Duration;

/// Compiler options that the CLI can set.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--set NAME=VALUE` dim overrides.
    pub overrides: Vec<(String, i64)>,
    /// Update each parameter as soon as its gradient is complete (default: on unless clipping).
    pub optimizer_in_backward: Option<bool>,
    /// Time cap of the layout search.
    pub layout_time: Duration,
    /// Overrides the `budget` of `train { }`.
    pub budget: Option<u64>,
    /// How recomputation is chosen.
    pub checkpoint: budget::CheckpointMode,
    /// Overrides the `precision` of `train { }`.
    pub precision: Option<settings::Precision>,
    /// Overrides `master_weights` of `train { }`.
    pub master_weights: Option<bool>,
    /// Overrides `accumulate` of `train { }` (micro-batches per step).
    pub accumulate: Option<u32>,
    /// Overrides AdamW's `state` (how its moments are stored).
    pub optimizer_state: Option<ops::optimizer::StateFormat>,
    /// The backend the plan is built for (its workspace and alignment).
    pub target: plan::Target,
    /// The GPU `--gpu` names: the report then carries the estimated step time on it, and
    /// checkpointing ranks by time on it (on [`cost::Gpu::default`], the H100, without one).
    pub gpu: Option<cost::Gpu>,
    /// Fuse `cross_entropy(x @ w, t)` into the chunked linear cross-entropy
    /// (`passes::fuse_loss`; default on).
    pub fuse_loss: bool,
    /// `--freeze` patterns: the parameters whose names match are frozen
    /// (`passes::freeze`).
    pub freeze: Vec<String>,
    /// `--lora`: adapters on the targeted weights, the model's own parameters frozen
    /// (`passes::lora`).
    pub lora: Option<passes::lora::LoraSpec>,
    /// `--quantize-frozen`: frozen weights that only matmuls read are stored quantized
    /// (`passes::quantize`); None stores them as they are.
    pub quantize_frozen: Option<ir::Scheme>,
    /// `--context-reserve`: the device bytes of the CUDA context beside a GPU plan's arena
    /// (the GPU's stated figure, [`cost::GpuSpec::context_reserve`], without it).
    pub context_reserve: Option<u64>,
    /// `--offload`: overrides `train { offload }` (what lives in host memory).
    pub offload: Option<settings::Offload>,
    /// `--parallel`: overrides `train { parallel }` (data parallelism with ZeRO).
    pub parallel: Option<parallel::Parallel>,
    /// Tiled training: every cross-entropy divides by the input [`tiling::KEPT`] (one value
    /// per micro-step) instead of the kept rows of its micro-batch's targets
    /// ([`passes::tile::kept_from_input`]).
    pub kept_from_input: bool,
    /// `--unified` (Some(true)): overrides `train { unified }` (the arena in CUDA unified
    /// memory, `report.unified`).
    pub unified: Option<bool>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            overrides: Vec::new(),
            optimizer_in_backward: None,
            layout_time: Duration::from_millis(200),
            budget: None,
            checkpoint: budget::CheckpointMode::Auto,
            precision: None,
            master_weights: None,
            accumulate: None,
            optimizer_state: None,
            target: plan::Target::Cpu,
            gpu: None,
            fuse_loss: true,
            freeze: Vec::new(),
            lora: None,
            quantize_frozen: None,
            context_reserve: None,
            offload: None,
            parallel: None,
            kept_from_input: false,
            unified: None,
        }
    }
}

/// Everything the pipeline produced.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub ast: front::ast::Model,
    /// The full graph (forward, backward, updates).
    pub graph: ir::Graph,
    pub plan: VerifiedPlan,
}

/// Why compilation failed: the user's input, or a broken internal invariant.
#[derive(Debug, Clone)]
pub enum CompileError {
    User(UserError),
    Internal(Vec<String>),
}

impl From<UserError> for CompileError {
    fn from(e: UserError) -> CompileError {
        CompileError::User(e)
    }
}

impl From<passes::megatron::SplitError> for CompileError {
    fn from(e: passes::megatron::SplitError) -> CompileError {
        match e {
            passes::megatron::SplitError::User(u) => CompileError::User(u),
            passes::megatron::SplitError::Internal(s) => s.into(),
        }
    }
}

impl From<passes::quantize::QuantizeError> for CompileError {
    fn from(e: passes::quantize::QuantizeError) -> CompileError {
        match e {
            passes::quantize::QuantizeError::User(u) => CompileError::User(u),
            passes::quantize::QuantizeError::Internal(s) => s.into(),
        }
    }
}

/// `graph` with its frozen weights quantized by `scheme` (`--quantize-frozen`, `train {
/// quantize_frozen }`), verified, and where each of its values went (None: nowhere, the
/// graph is unchanged).
fn quantized(
    graph: ir::Graph,
    scheme: Option<ir::Scheme>,
) -> Result<(ir::Graph, Option<Vec<ir::ValueId>>), CompileError> {
    let Some(scheme) = scheme else {
        return Ok((graph, None));
    };
    let out = passes::quantize::run(&graph, scheme)?;
    verified(&out.graph, "quantize")?;
    Ok((out.graph, Some(out.map)))
}

impl From<passes::StageError> for CompileError {
    fn from(e: passes::StageError) -> CompileError {
        CompileError::Internal(vec![e.to_string()])
    }
}

/// Value `v`'s id after a pass that renumbered the graph (`map`), or an internal error when
/// the pass folded it away.
fn followed(
    map: &[Option<ir::ValueId>],
    v: ir::ValueId,
    pass: &str,
) -> Result<ir::ValueId, CompileError> {
    map.get(v.index())
        .copied()
        .flatten()
        .ok_or_else(|| CompileError::Internal(vec![format!("{pass} folded away {v}")]))
}

fn verified(graph: &ir::Graph, pass: &str) -> Result<(), CompileError> {
    ir::verify(graph).map_err(|errs| {
        CompileError::Internal(
            errs.into_iter()
                .map(|e| format!("after {pass}: {e}"))
                .collect(),
        )
    })
}

/// Applies the command line's budget, precision, master-weights, accumulation, optimizer
/// state, LoRA and frozen-weight quantization settings to `train { }`; pure fp16 (no master weights), 8-bit state for SGD and
/// stochastic rounding with master weights (nothing to round) are refused.
fn apply_train_options(
    t: &mut front::train::TrainSpec,
    options: &Options,
) -> Result<(), UserError> {
    if let Some(budget) = options.budget {
        t.settings.budget = Some(budget);
        t.budget_span = None;
    }
    t.settings.precision = options.precision.unwrap_or(t.settings.precision);
    t.settings.master_weights = options.master_weights.unwrap_or(t.settings.master_weights);
    t.settings.accumulate = options.accumulate.unwrap_or(t.settings.accumulate);
    t.settings.lora = options.lora.clone().or(t.settings.lora.take());
    t.settings.quantize_frozen = options.quantize_frozen.or(t.settings.quantize_frozen);
    t.settings.offload = options.offload.or(t.settings.offload);
    t.settings.parallel = options.parallel.or(t.settings.parallel);
    if let Some(unified) = options.unified {
        t.settings.unified = unified;
        t.unified_span = t.unified_span.filter(|_| unified);
    }
    front::train::check_unified(t, options.target != plan::Target::Cpu)?;
    if !t.settings.master_weights && t.settings.precision != settings::Precision::Bf16 {
        return Err(UserError::at(
            t.precision_span,
            format!(
                "master_weights = off needs bf16, not {}",
                format!("{:?}", t.settings.precision).to_lowercase()
            ),
            "this precision",
            "use `precision = bf16` (fp16 weights without fp32 masters lose small updates and overflow)",
        ));
    }
    if let Some(state) = options.optimizer_state {
        match &mut t.settings.optimizer {
            settings::Optimizer::AdamW(p) => p.state = state,
            settings::Optimizer::Sgd(_) if state.is_fp32() => {}
            settings::Optimizer::Sgd(_) => return Err(UserError::at(
                t.span,
                "--optimizer-state int8 quantizes AdamW's moments, and this step trains with SGD",
                "SGD here",
                "use `optimizer = adamw(...)`, or drop --optimizer-state",
            )),
        }
    }
    let pure_bf16 = !t.settings.master_weights && t.settings.precision == settings::Precision::Bf16;
    match t.stochastic_rounding_span {
        Some(span) if !pure_bf16 => Err(UserError::at(
            span,
            "stochastic_rounding rounds bf16 parameters, and this step keeps fp32 parameters",
            "nothing to round",
            "use `precision = bf16` with `master_weights = off` (or --master-weights off); \
             fp32 master weights keep every update exactly",
        )),
        _ => Ok(()),
    }
}

/// Whether each update runs as soon as its gradient is complete: `requested`, by default
/// unless something needs every gradient first (clipping, the fp16 overflow check, gradient
/// accumulation), which also refuses a request for it.
fn optimizer_in_backward(
    t: &front::train::TrainSpec,
    loss_scaled: bool,
    requested: Option<bool>,
) -> Result<bool, UserError> {
    let needs_all_grads =
        t.settings.clip_grad_norm.is_some() || loss_scaled || t.settings.accumulate > 1;
    let in_backward = requested.unwrap_or(!needs_all_grads);
    if !(in_backward && needs_all_grads) {
        return Ok(in_backward);
    }
    let why = if t.settings.clip_grad_norm.is_some() {
        (
            "global-norm clipping",
            "clip_grad_norm is set",
            "clipping needs every gradient first: drop --optimizer-in-backward or the clipping",
        )
    } else if t.settings.accumulate > 1 {
        ("gradient accumulation", "accumulate is set", "the update needs every micro-batch's gradient: drop --optimizer-in-backward or the accumulation")
    } else {
        ("fp16 loss scaling", "precision is fp16", "the overflow check needs every gradient first: drop --optimizer-in-backward or use bf16")
    };
    Err(UserError::at(
        t.span,
        format!("the optimizer cannot run in backward with {}", why.0),
        why.1,
        why.2,
    ))
}

/// The model lowered under `overrides`, its parameters frozen as `options` say and its
/// `train { }` settings overridden by `options`.
fn lowered(
    ast: &front::ast::Model,
    overrides: &[(String, i64)],
    options: &Options,
) -> Result<front::Module, CompileError> {
    let mut module = front::lower(ast, overrides)?;
    passes::freeze::run(&mut module.graph, &options.freeze)?;
    if options.kept_from_input {
        module.graph = passes::tile::kept_from_input(&module.graph)?;
    }
    verified(&module.graph, "lower")?;
    for (flag, set) in [
        ("--lora", options.lora.is_some()),
        ("--offload", options.offload.is_some()),
        ("--parallel", options.parallel.is_some()),
        ("--unified", options.unified == Some(true)),
    ] {
        if set && module.train.is_none() {
            return Err(diagnostic::UserError::general(
                format!("{flag} applies to training, and this model has no `train {{ }}`"),
                format!("add a train block, or compile without {flag}"),
            )
            .into());
        }
    }
    if let Some(t) = module.train.as_mut() {
        apply_train_options(t, options)?;
    }
    Ok(module)
}

/// Compiles `.mdl` source text into a verified plan. With data parallelism the plan is one
/// rank's: the model as written (with `batch = global`, its batch dim divided by the
/// ranks), its collectives as steps and `report.parallel` saying what every rank needs.
/// With pipeline parallelism it is stage 0's plan carrying the other stages' plans
/// (`Plan::stages`), and `graph` is stage 0's.
pub fn compile(source: &str, options: &Options) -> Result<Compiled, CompileError> {
    let ast = front::parse(source)?;
    let mut module = lowered(&ast, &options.overrides, options)?;
    let parallel = module.train.as_ref().and_then(|t| t.settings.parallel);
    if let (Some(p), Some(t)) = (parallel, module.train.as_ref()) {
        front::parallel::check(t, p)?;
        let data = if p.global_batch { p.data } else { 1 };
        if data * p.microbatches > 1 {
            let parts = (data, p.microbatches);
            let overrides =
                front::parallel::rank_overrides(&ast, &module.graph, &options.overrides, parts)?;
            module = lowered(&ast, &overrides, options)?;
        }
    }
    let mut tensor_splits = std::collections::BTreeMap::new();
    if let (Some(p), Some(t)) = (parallel.filter(|p| p.tensor > 1), module.train.as_ref()) {
        let split = passes::megatron::run(&module.graph, p.tensor).map_err(|e| match e {
            passes::megatron::SplitError::User(u) if u.span.is_none() => CompileError::User(
                diagnostic::UserError::at(t.span, u.message, "this train section", u.help),
            ),
            e => e.into(),
        })?;
        verified(&split.graph, "megatron")?;
        module.graph = split.graph;
        tensor_splits = split.params;
    }
    if let Some(spec) = module.train.as_ref().and_then(|t| t.settings.lora.clone()) {
        module.graph = passes::lora::run(&module.graph, &spec)?;
        verified(&module.graph, "lora")?;
    }
    if options.fuse_loss {
        let hidden = module
            .train
            .as_ref()
            .and_then(|t| match t.settings.precision {
                settings::Precision::Fp32 => None,
                settings::Precision::Bf16 => Some(ir::DType::BF16),
                settings::Precision::Fp16 => Some(ir::DType::F16),
            });
        module.graph = passes::fuse_loss::run(&module.graph, hidden)?;
        verified(&module.graph, "fuse_loss")?;
    }
    if let (Some(p), Some(t)) = (parallel.filter(|p| p.pipeline > 1), module.train.as_ref()) {
        return stages::compile(source, ast, (&module, &tensor_splits), options, p, t.span);
    }
    let (graph, mut plan) = planned(&module, options, parallel, None)?;
    for p in &mut plan.params {
        p.tensor_split = tensor_splits.get(&p.name).cloned();
    }
    let plan = checked(annotated(plan, source))?;
    Ok(Compiled { ast, graph, plan })
}

/// `plan` with the largest tensors live at its peak and its buffers' `.mdl` lines, read
/// from `source`.
pub(crate) fn annotated(mut plan: plan::Plan, source: &str) -> plan::Plan {
    plan.report.largest_at_peak = plan::largest_at_peak(&plan, source, 10);
    plan::attach_lines(&mut plan, source);
    plan
}

/// `plan` verified; a violation is an internal error.
pub(crate) fn checked(plan: plan::Plan) -> Result<VerifiedPlan, CompileError> {
    plan::verify(plan)
        .map_err(|errs| CompileError::Internal(errs.into_iter().map(|e| e.to_string()).collect()))
}

/// A peephole fold of a whole graph: the new graph and each old value's new one.
type Fold = fn(&ir::Graph) -> Result<(ir::Graph, Vec<Option<ir::ValueId>>), passes::StageError>;

/// The peephole folds after autodiff (and on inference graphs), in order: the pass's name,
/// what a value folded away by it is called, and the fold.
const FOLDS: [(&str, &str, Fold); 4] = [
    (
        "bias_epilogue",
        "the bias epilogue",
        passes::bias_epilogue::fold,
    ),
    (
        "packed_attention",
        "packed attention",
        passes::packed_attention::fold,
    ),
    ("promote", "promotion", passes::promote::fold),
    (
        "norm_accumulate",
        "the norm's accumulated input gradient",
        passes::norm_accumulate::fold,
    ),
];

/// The training (or inference) step of `module`'s forward graph planned under `options`:
/// mixed precision, ZeRO's rewrites under `parallel`, autodiff, the optimizer, the budget's
/// choices, schedule (in 1F1B order on a pipeline stage, `pipeline`), liveness and layout,
/// and the report (estimate, device bytes, `report.parallel` for this plan's ranks). The
/// plan is not verified yet.
pub(crate) fn planned(
    module: &front::Module,
    options: &Options,
    parallel: Option<parallel::Parallel>,
    pipeline: Option<passes::pipeline::order::OneFOneB>,
) -> Result<(ir::Graph, plan::Plan), CompileError> {
    let (graph, in_backward) = match &module.train {
        Some(spec) => {
            let t = &spec.settings;
            let loss = module.graph.output("loss").ok_or_else(|| {
                CompileError::Internal(vec!["training graph without loss".into()])
            })?;
            let mut mixed =
                passes::precision::run(&module.graph, loss, t.precision, t.master_weights)?;
            verified(&mixed.graph, "precision")?;
            if let Some(p) = parallel.filter(|p| p.zero == 3) {
                let sharded = passes::partition::shard_params(&mixed.graph, p.ranks())?;
                verified(&sharded.graph, "partition")?;
                mixed.graph = sharded.graph;
                mixed.objective = sharded.map[mixed.objective.index()];
                mixed.loss_scale = mixed.loss_scale.map(|s| sharded.map[s.index()]);
            }
            let offload = t.offload.is_some_and(settings::Offload::optimizer);
            let masters = parallel.is_some_and(|p| matches!(p.zero, 1 | 2))
                && t.precision != settings::Precision::Fp32
                && t.master_weights
                && !offload;
            if masters {
                let copies = passes::partition::keep_16bit_copies(&mixed.graph)?;
                verified(&copies.graph, "partition")?;
                mixed.graph = copies.graph;
                mixed.objective = copies.map[mixed.objective.index()];
                mixed.loss_scale = mixed.loss_scale.map(|s| copies.map[s.index()]);
            }
            let (graph, map) = quantized(mixed.graph, t.quantize_frozen)?;
            mixed.graph = graph;
            if let Some(map) = map {
                mixed.objective = map[mixed.objective.index()];
                mixed.loss_scale = mixed.loss_scale.map(|s| map[s.index()]);
            }
            let (graph, map) = passes::widen::narrow_norms(&mixed.graph)?;
            verified(&graph, "narrow")?;
            mixed.graph = graph;
            let kept = |v| followed(&map, v, "narrowing");
            mixed.objective = kept(mixed.objective)?;
            mixed.loss_scale = mixed.loss_scale.map(kept).transpose()?;
            let diff = passes::autodiff::run(&mixed.graph, mixed.objective)?;
            verified(&diff.graph, "autodiff")?;
            let diff = passes::saves::choose(diff)?.diff;
            verified(&diff.graph, "saves")?;
            let diff = passes::widen::run(&diff)?;
            verified(&diff.graph, "widen")?;
            let diff = passes::concat_grads::run(&diff)?;
            verified(&diff.graph, "concat_grads")?;
            let mut diff = diff;
            for (pass, what, fold) in FOLDS {
                let (folded, map) = passes::rewrite::refold(&diff, pass, fold)?;
                verified(&folded.graph, pass)?;
                mixed.loss_scale = (mixed.loss_scale)
                    .map(|s| followed(&map, s, what))
                    .transpose()?;
                diff = folded;
            }
            let opts = passes::optimizer::OptimizerOptions {
                optimizer: t.optimizer,
                clip_grad_norm: t.clip_grad_norm,
                loss_scale: mixed.loss_scale,
                accumulate: t.accumulate,
                stochastic_rounding: t.stochastic_rounding,
                offload,
                clip_span: spec.clip_grad_norm_span,
                parallel,
                masters,
            };
            let mut g = passes::optimizer::run(&diff, &opts)?;
            verified(&g, "optimizer")?;
            let in_backward = optimizer_in_backward(
                spec,
                mixed.loss_scale.is_some(),
                options.optimizer_in_backward,
            )?;
            if !offload && parallel.is_none() {
                g = passes::group_updates::run(&g, in_backward)?.0;
                verified(&g, "group_updates")?;
            }
            (g, in_backward)
        }
        None => {
            let graph = quantized(module.graph.clone(), options.quantize_frozen)?.0;
            let mut graph = graph;
            for (pass, _, fold) in FOLDS {
                graph = fold(&graph)?.0;
                verified(&graph, pass)?;
            }
            (graph, false)
        }
    };
    let build = BuildOptions {
        optimizer_in_backward: in_backward,
        layout_time: options.layout_time,
        alignment: options.target.alignment(),
        pipeline,
    };
    let gpu = options.gpu.unwrap_or_default();
    let reserve = match options.target {
        plan::Target::Cuda { .. } => Some(
            options
                .context_reserve
                .unwrap_or(gpu.spec().context_reserve),
        ),
        plan::Target::Cpu => None,
    };
    let nccl = reserve.and(parallel).map(|_| cost::NCCL_RESERVE);
    let step = budget::Step {
        target: options.target,
        model: &module.name,
        graph: &graph,
        train: module.train.as_ref(),
        gpu,
        reserve: reserve.unwrap_or(0).saturating_add(nccl.unwrap_or(0)),
    };
    let (graph, mut plan) = budget::fit(step, options.checkpoint, &build).map_err(|e| match e {
        budget::FitError::User(u) => CompileError::User(u),
        budget::FitError::Internal(e) => e.into(),
    })?;
    let unified = module.train.as_ref().filter(|t| t.settings.unified);
    plan.report.unified = unified.map(|t| {
        let capacity = t.settings.budget.unwrap_or(gpu.spec().memory);
        plan::unified_report(&plan, (capacity, reserve.unwrap_or(0)), gpu)
    });
    plan.report.estimate = options.gpu.map(|gpu| cost::estimate(&plan, gpu));
    if plan.report.transfers.is_some() {
        let time = (plan.report.estimate.as_ref())
            .map_or_else(|| cost::estimate(&plan, gpu).offload, |e| e.offload.clone());
        if let Some(t) = plan.report.transfers.as_mut() {
            t.time = time;
        }
    }
    plan.report.device = reserve.map(|context_reserve| plan::DeviceBytes {
        arena: plan.arena_bytes,
        context_reserve,
        nccl_reserve: nccl.unwrap_or(0),
        total: (plan.arena_bytes.saturating_add(context_reserve)).saturating_add(nccl.unwrap_or(0)),
    });
    plan.report.parallel = parallel.map(|p| plan::parallel_report(&plan, p, nccl));
    Ok((graph, plan))
}
