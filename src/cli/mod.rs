//! Argument parsing and dispatch to the library; user errors print as miette diagnostics
//! and exit with code 2, internal errors with code 3.

mod adapters;
mod advise;
mod fit;
mod fit_ranks;
mod import;
mod output;
mod run;
mod tile;
mod viz;

use clap::{Parser, Subcommand, ValueEnum};
use memc::diagnostic::{Report, UserError};
use memc::{CompileError, Compiled, Options};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "memc",
    version,
    about = "Compile a model spec into a memory-planned training step"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    Text,
    Json,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Emit {
    Report,
    Ast,
    Graph,
    Plan,
}

/// Seconds the layout search may take unless `--layout-time` says otherwise.
const LAYOUT_TIME: f64 = 0.2;

#[derive(clap::Args, Clone)]
pub struct CompileArgs {
    /// The .mdl file.
    file: PathBuf,
    /// Override a dim: --set B=16 (repeatable; the last value given for a dim wins).
    #[arg(long = "set", value_name = "NAME=VALUE")]
    set: Vec<String>,
    /// Override the budget of `train { }`, e.g. 16GiB.
    #[arg(long)]
    budget: Option<String>,
    /// Update each parameter as soon as its gradient is complete (default on unless clipping).
    #[arg(long, value_name = "on|off")]
    optimizer_in_backward: Option<String>,
    /// Seconds the layout search may take.
    #[arg(long, default_value_t = LAYOUT_TIME)]
    layout_time: f64,
    /// Recomputation: auto (only when the budget demands, then the fitting policy with the
    /// least recompute), none, pointwise, block (each block's input saved, one block
    /// recomputed at a time), every=K (every K-th block's output saved), first=K (the first K
    /// blocks recomputed, pointwise elsewhere), sqrt (K = round(sqrt(blocks))), selective
    /// (cheap ops inside blocks recomputed, heavy ops' outputs kept), mincut or knapsack=SIZE
    /// (per block pointwise, selective or whole recomputation, saving SIZE, e.g. 1GiB, beyond
    /// pointwise for the fewest recomputed FLOPs).
    #[arg(long, default_value = "auto", value_name = "POLICY")]
    checkpoint: String,
    /// Mixed precision, overriding `train { precision }`: matmul, conv and attention in the
    /// low precision with fp32 master weights and optimizer (fp16 adds dynamic loss scaling).
    #[arg(long, value_enum)]
    precision: Option<PrecisionArg>,
    /// Keep fp32 master weights in a bf16 step (default on); off stores parameters in bf16.
    #[arg(long, value_name = "on|off")]
    master_weights: Option<String>,
    /// Micro-batches per step, overriding `train { accumulate }`: gradients accumulate over
    /// this many runs of the model as written, then one update. `memc fit --accumulate`
    /// without N searches the micro-batch instead.
    #[arg(long, value_name = "N", num_args = 0..=1, value_parser = clap::value_parser!(u32).range(1..))]
    accumulate: Option<Option<u32>>,
    /// How AdamW stores its moments, overriding `adamw(state = ...)`: fp32 (8 bytes a
    /// parameter) or int8 (block-wise 8-bit, 2 bytes a parameter and 8 per 2048).
    #[arg(long, value_name = "fp32|int8", value_parser = ["fp32", "int8"])]
    optimizer_state: Option<String>,
    /// Backend the plan is built for: cpu (reference) or cuda (sm_80 or newer), which decides
    /// each step's scratch buffer. `memc run` also executes on it.
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"])]
    device: String,
    /// Estimate the step time on this GPU (a100, h100, h200, gh200, rtx4090): the report gains
    /// the estimate, and checkpointing ranks its candidates by time on it (h100 without).
    #[arg(long, value_name = "NAME")]
    gpu: Option<String>,
    /// Device bytes of the CUDA context beside a --device cuda plan's arena, e.g. 600MiB
    /// (default: the figure stated for the --gpu, 529 MiB as measured on an H200); --budget
    /// holds the arena and this together.
    #[arg(long, value_name = "SIZE")]
    context_reserve: Option<String>,
    /// Fuse the loss head `cross_entropy(x @ w, t)` into a chunked linear cross-entropy that
    /// never holds the logits (default on); off keeps the matmul and cross-entropy.
    #[arg(long, value_name = "on|off")]
    fuse_loss: Option<String>,
    /// Freeze the parameters whose names match PATTERN (`*` matches any run of characters,
    /// e.g. `layer.*.attn.*`): no gradient, no optimizer state (repeatable).
    #[arg(long, value_name = "PATTERN")]
    freeze: Vec<String>,
    /// LoRA adapters: r=RANK[,alpha=A][,targets=NAME+NAME] (alpha defaults to r; targets
    /// default to every linear layer in the blocks); the model's own parameters are frozen.
    #[arg(long, value_name = "SPEC")]
    lora: Option<String>,
    /// Store frozen weights that only matmuls read (the base under --lora, `frozen`,
    /// --freeze) quantized: int8 (one f32 absmax scale per output channel) or nf4 (QLoRA's
    /// 4-bit NormalFloat, blocks of 64, double-quantized absmaxes); an error when nothing
    /// qualifies. `memc run --save-params` writes such weights dequantized, as f32.
    #[arg(long, value_name = "int8|nf4")]
    quantize_frozen: Option<String>,
    /// Keep the optimizer state or the saved activations in host memory, overriding
    /// `train { offload }`: `optimizer` runs the update on the host, each gradient and
    /// parameter copied there and the parameter back; `activations` copies each activation
    /// backward reads to the host after its producer and back before its first backward
    /// reader; `all` does both; `none` keeps everything on the device (without it, a budget
    /// weighs offload against checkpointing by estimated time).
    #[arg(long, value_name = "optimizer|activations|all|none")]
    offload: Option<String>,
    /// Data parallelism, overriding `train { parallel }`:
    /// data=N[,zero=0|1|2|3][,batch=per_rank|global] plans one rank of N, each running the
    /// model's batch (per_rank, the default) or 1/N of it (global); ZeRO-1 shards the
    /// optimizer state over the ranks, 2 also the gradients, 3 also the parameters;
    /// tensor=T splits each block over T ranks; pipeline=P,microbatches=M cuts the blocks
    /// into P stages run in 1F1B order over M micro-batches. `memc run` runs every rank.
    #[arg(long, value_name = "data=N,zero=K")]
    parallel: Option<String>,
    /// Run over tiles: DIM=SIDE cuts every input dim written as DIM into tiles of SIDE,
    /// each computed from a window with the halo its receptive field reads; DIM=auto takes
    /// the fewest tiles whose plan fits --budget (`memc compile`, `memc check`, `memc run`).
    #[arg(long, value_name = "DIM=SIDE|DIM=auto")]
    tile: Option<String>,
    /// Plan the arena in CUDA unified memory (cudaMallocManaged; needs --device cuda),
    /// overriding `train { unified }`: the plan is the one without the budget's
    /// checkpointing, and the report says what of it is resident in the --budget (or the
    /// --gpu's memory), the bytes paged out, where page faults fall and their estimated time.
    #[arg(long)]
    unified: bool,
}

impl CompileArgs {
    /// The options given that shape compilation (all but the file and `--device`), by flag,
    /// so that running an already compiled plan can refuse them instead of ignoring them.
    pub fn compile_options_given(&self) -> Vec<&'static str> {
        let given = [
            ("--set", !self.set.is_empty()),
            ("--budget", self.budget.is_some()),
            (
                "--optimizer-in-backward",
                self.optimizer_in_backward.is_some(),
            ),
            ("--layout-time", self.layout_time != LAYOUT_TIME),
            ("--checkpoint", self.checkpoint != "auto"),
            ("--precision", self.precision.is_some()),
            ("--master-weights", self.master_weights.is_some()),
            ("--accumulate", self.accumulate.is_some()),
            ("--optimizer-state", self.optimizer_state.is_some()),
            ("--gpu", self.gpu.is_some()),
            ("--context-reserve", self.context_reserve.is_some()),
            ("--fuse-loss", self.fuse_loss.is_some()),
            ("--freeze", !self.freeze.is_empty()),
            ("--lora", self.lora.is_some()),
            ("--quantize-frozen", self.quantize_frozen.is_some()),
            ("--offload", self.offload.is_some()),
            ("--parallel", self.parallel.is_some()),
            ("--tile", self.tile.is_some()),
            ("--unified", self.unified),
        ];
        given
            .into_iter()
            .filter_map(|(flag, on)| on.then_some(flag))
            .collect()
    }

    /// Whether `--accumulate` was given without a count (`memc fit`'s accumulation search).
    pub fn accumulate_search(&self) -> bool {
        self.accumulate == Some(None)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PrecisionArg {
    Fp32,
    Bf16,
    Fp16,
}

#[derive(Subcommand)]
enum Command {
    /// Compile a model and print its memory report (or another stage with --emit).
    Compile {
        #[command(flatten)]
        args: CompileArgs,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        #[arg(long, value_enum, default_value_t = Emit::Report)]
        emit: Emit,
        /// Print the memory in the table of PyTorch's torch.cuda.memory_summary() (allocated
        /// bytes at the end of the step, at its peak, in all and freed, by role; the arena as
        /// reserved memory; buffer counts) instead of the report.
        #[arg(long, conflicts_with_all = ["emit", "format"])]
        summary: bool,
        /// Write to this file (atomically) instead of stdout.
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Check a model for errors without printing a report.
    Check {
        #[command(flatten)]
        args: CompileArgs,
    },
    /// Write each kernel's CUDA source (and PTX when NVRTC is available), the plan and a
    /// manifest; the plan is built for the CUDA backend whatever --device says.
    Emit {
        #[command(flatten)]
        args: CompileArgs,
        /// Output folder.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Execute steps of a model or a plan JSON on the CPU reference backend or the GPU
    /// (`--device cuda`), printing each step's loss.
    Run(run::RunArgs),
    /// Import an ONNX model as a .mdl and its weights (.safetensors).
    Import(import::ImportArgs),
    /// Find the largest value of a dim (default B) whose plan fits --budget.
    Fit(fit::FitArgs),
    /// Compare memory-saving options against a budget, each a compiled plan.
    Advise(advise::AdviseArgs),
    /// Write the arena over time as a self-contained HTML page.
    Viz(viz::VizArgs),
    /// Lay out a MiniMalloc CSV instance (`id,lower,upper,size`): the arena size beside its
    /// lower bound, whether it is optimal, and with `-o` each buffer's offset.
    Arena {
        /// The instance, a CSV file with header `id,lower,upper,size`.
        file: PathBuf,
        /// Stop searching at the first layout of at most this many bytes, and report whether
        /// it fits.
        #[arg(long)]
        capacity: Option<u64>,
        /// Seconds the layout search may take.
        #[arg(long, default_value_t = 10.0)]
        layout_time: f64,
        /// Write the instance with an `offset` column to this file (atomically).
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Measure: `memc bench arena [DIR]` (MiniMalloc instances), `memc bench checkpoint [DIR]`
    /// or `memc bench compile [DIR]` (compile time and peak memory; DIR holds the examples).
    Bench {
        /// What to measure.
        #[arg(value_parser = ["arena", "checkpoint", "compile"])]
        what: String,
        /// The folder of MiniMalloc CSV instances (arena; default
        /// ../shared/benchmarks/minimalloc) or of the example models (default examples).
        dir: Option<PathBuf>,
        /// Seconds the layout search may take per instance (arena).
        #[arg(long, default_value_t = 10.0)]
        layout_time: f64,
    },
}

/// A failure of a CLI command: a diagnostic (exit 2) or an internal error (exit 3).
pub enum Failure {
    User(Box<Report>),
    Plain(String),
    Internal(Vec<String>),
}

impl Failure {
    fn user(e: UserError, name: &str, src: &str) -> Failure {
        Failure::User(Box::new(e.with_source(name, src)))
    }
}

/// Runs the CLI and returns the process exit code.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    match dispatch(cli.command) {
        Ok(()) => 0,
        Err(Failure::User(r)) => {
            eprintln!("{:?}", miette::Report::new(*r));
            2
        }
        Err(Failure::Plain(msg)) => {
            eprintln!("error: {msg}");
            2
        }
        Err(Failure::Internal(errs)) => {
            for e in errs {
                eprintln!("internal error: {e}");
            }
            3
        }
    }
}

/// Reads a source file as UTF-8, turning problems into diagnostics.
pub fn read_source(path: &Path) -> Result<String, Failure> {
    let bytes = std::fs::read(path)
        .map_err(|e| Failure::Plain(format!("cannot read {}: {e}", path.display())))?;
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let text = String::from_utf8_lossy(e.as_bytes()).into_owned();
        Failure::user(
            UserError::at(
                memc::ir::Span::new(at, at + 1),
                "the file is not valid UTF-8",
                "invalid byte",
                "save the file as UTF-8",
            ),
            &path.display().to_string(),
            &text,
        )
    })
}

fn parse_size(text: &str) -> Result<u64, Failure> {
    memc::budget::parse_size(text).map_err(Failure::Plain)
}

/// The value of a flag that takes one of a few words, parsed by `parse`; a word it refuses
/// is a diagnostic pointing at the word, saying it is an unknown `what`, with `help`.
fn word_flag<T>(
    (flag, text): (&str, &Option<String>),
    parse: impl Fn(&str) -> Option<T>,
    what: &str,
    help: &str,
) -> Result<Option<T>, Failure> {
    let Some(text) = text.as_deref() else {
        return Ok(None);
    };
    parse(text).map(Some).ok_or_else(|| {
        let e = UserError::at(
            memc::ir::Span::new(0, text.len()),
            format!("unknown {what} `{text}`"),
            format!("this {what}"),
            help,
        );
        Failure::user(e, flag, text)
    })
}

fn options(args: &CompileArgs) -> Result<Options, Failure> {
    let mut overrides = Vec::new();
    for s in &args.set {
        let Some((k, v)) = s.split_once('=') else {
            return Err(Failure::Plain(format!("`--set {s}`: expected NAME=VALUE")));
        };
        let v: i64 = v
            .trim()
            .parse()
            .map_err(|_| Failure::Plain(format!("`--set {s}`: {v} is not an integer")))?;
        if v <= 0 {
            return Err(Failure::Plain(format!(
                "`--set {s}`: dims must be positive"
            )));
        }
        overrides.push((k.trim().to_string(), v));
    }
    let optimizer_in_backward = on_off("--optimizer-in-backward", &args.optimizer_in_backward)?;
    let master_weights = on_off("--master-weights", &args.master_weights)?;
    let fuse_loss = on_off("--fuse-loss", &args.fuse_loss)?.unwrap_or(true);
    let budget = args.budget.as_deref().map(parse_size).transpose()?;
    if !(args.layout_time.is_finite() && args.layout_time >= 0.0) {
        return Err(Failure::Plain(
            "--layout-time must be a non-negative number of seconds".into(),
        ));
    }
    let checkpoint = memc::budget::CheckpointMode::parse(&args.checkpoint)
        .map_err(|e| Failure::user(e, "--checkpoint", &args.checkpoint))?;
    let gpu = gpu_of(args)?;
    let quantize_frozen = word_flag(
        ("--quantize-frozen", &args.quantize_frozen),
        memc::ir::Scheme::parse,
        "quantization scheme",
        "use int8 (per output channel) or nf4 (QLoRA's NormalFloat4)",
    )?;
    let offload = word_flag(
        ("--offload", &args.offload),
        memc::settings::Offload::parse,
        "offload",
        memc::settings::Offload::HELP,
    )?;
    let parallel = args
        .parallel
        .as_deref()
        .map(|text| {
            memc::parallel::Parallel::parse_flag(text)
                .map_err(|e| Failure::user(e, "--parallel", text))
        })
        .transpose()?;
    Ok(Options {
        parallel,
        unified: args.unified.then_some(true),
        overrides,
        optimizer_in_backward,
        layout_time: Duration::from_secs_f64(args.layout_time),
        budget,
        checkpoint,
        precision: args.precision.map(|p| match p {
            PrecisionArg::Fp32 => memc::settings::Precision::Fp32,
            PrecisionArg::Bf16 => memc::settings::Precision::Bf16,
            PrecisionArg::Fp16 => memc::settings::Precision::Fp16,
        }),
        master_weights,
        accumulate: args.accumulate.flatten(),
        optimizer_state: args
            .optimizer_state
            .as_deref()
            .and_then(memc::ops::optimizer::StateFormat::parse),
        target: if args.device == "cuda" {
            memc::plan::Target::CUDA_MIN
        } else {
            memc::plan::Target::Cpu
        },
        gpu,
        fuse_loss,
        freeze: args.freeze.clone(),
        quantize_frozen,
        offload,
        lora: args
            .lora
            .as_deref()
            .map(memc::passes::lora::LoraSpec::parse)
            .transpose()
            .map_err(|e| Failure::Plain(format!("--lora: {e}")))?,
        // A reserve of 0 budgets the arena alone.
        context_reserve: args
            .context_reserve
            .as_deref()
            .map(|r| {
                if r.trim() == "0" {
                    Ok(0)
                } else {
                    parse_size(r)
                }
            })
            .transpose()?,
        kept_from_input: false,
    })
}

/// The GPU `--gpu` names, if any; an unknown name is a user error listing the known ones.
fn gpu_of(args: &CompileArgs) -> Result<Option<memc::cost::Gpu>, Failure> {
    args.gpu
        .as_deref()
        .map(|g| memc::cost::Gpu::parse(g).map_err(|e| Failure::user(e, "--gpu", g)))
        .transpose()
}

/// The source, options and budget of a command that needs `--budget`; a plain failure
/// saying so when it is missing.
fn budgeted(args: &CompileArgs, command: &str) -> Result<(String, Options, u64), Failure> {
    let src = read_source(&args.file)?;
    let opts = options(args)?;
    let Some(budget) = opts.budget else {
        return Err(Failure::Plain(format!(
            "memc {command} needs --budget SIZE (e.g. --budget 24GiB)"
        )));
    };
    Ok((src, opts, budget))
}

/// The value of an `on|off` flag, if given.
fn on_off(flag: &str, value: &Option<String>) -> Result<Option<bool>, Failure> {
    match value.as_deref() {
        None => Ok(None),
        Some("on") => Ok(Some(true)),
        Some("off") => Ok(Some(false)),
        Some(o) => Err(Failure::Plain(format!("{flag} takes on or off, not `{o}`"))),
    }
}

/// Compiles the file named in `args`.
pub fn compile_file(args: &CompileArgs) -> Result<Compiled, Failure> {
    if args.accumulate_search() {
        return Err(Failure::Plain(
            "--accumulate needs a count here (e.g. --accumulate 4); only `memc fit` searches it"
                .into(),
        ));
    }
    if args.tile.is_some() {
        return Err(Failure::Plain(
            "--tile applies to `memc compile`, `memc check` and `memc run`".into(),
        ));
    }
    let src = read_source(&args.file)?;
    let opts = options(args)?;
    let (compiled, offloaded) = memc::compile_or_offload(&src, &opts).map_err(|e| match e {
        CompileError::User(u) => Failure::user(u, &args.file.display().to_string(), &src),
        CompileError::Internal(errs) => Failure::Internal(errs),
    })?;
    if let Some(o) = offloaded {
        eprintln!(
            "memc: the plan with the least estimated step time within the budget keeps {} in host memory (--offload {}; --offload or `train {{ offload }}` decides it instead)",
            o.what(),
            o.word()
        );
    }
    Ok(compiled)
}

/// What `memc compile` prints of `compiled`: the summary table, the AST, the graph, the
/// plan or the report as `emit` and `format` ask.
fn rendered(
    compiled: &Compiled,
    emit: Emit,
    format: Format,
    summary: bool,
) -> Result<String, Failure> {
    Ok(match (emit, format) {
        _ if summary => memc::plan::render_memory_summary(compiled.plan.plan()),
        (Emit::Ast, _) => format!("{:#?}\n", compiled.ast),
        (Emit::Graph, _) => memc::ir::print(&compiled.graph),
        (Emit::Plan, _) | (Emit::Report, Format::Json) => {
            output::json(compiled.plan.plan(), emit == Emit::Plan)?
        }
        (Emit::Report, Format::Text) => memc::plan::render_text(compiled.plan.plan()),
    })
}

fn dispatch(command: Command) -> Result<(), Failure> {
    match command {
        Command::Compile {
            args,
            format,
            emit,
            summary,
            output,
        } => {
            if args.tile.is_some() {
                return tile::compile(&args, emit, format, summary, output.as_deref());
            }
            let text = rendered(&compile_file(&args)?, emit, format, summary)?;
            output::write(output.as_deref(), &text)
        }
        Command::Check { args } => {
            if args.tile.is_some() {
                tile::tiled(&args)?;
            } else {
                compile_file(&args)?;
            }
            eprintln!("ok: {}", args.file.display());
            Ok(())
        }
        Command::Run(args) => run::run(args),
        Command::Import(args) => import::import(args),
        Command::Fit(args) => fit::fit(args),
        Command::Viz(args) => viz::viz(args),
        Command::Advise(args) => advise::advise(args),
        Command::Emit { mut args, output } => {
            args.device = "cuda".into();
            let gpu = gpu_of(&args)?.unwrap_or_default();
            output::emit(&compile_file(&args)?, &output, gpu)
        }
        Command::Arena {
            file,
            capacity,
            layout_time,
            output,
        } => output::arena(&file, capacity, layout_time, output.as_deref()),
        Command::Bench {
            what,
            dir,
            layout_time,
        } => output::bench(&what, dir, layout_time),
    }
}
