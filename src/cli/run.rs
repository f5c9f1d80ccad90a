//! `memc run`: executes training steps of a model (or of a saved plan JSON) on the CPU
//! reference backend or, with `--device cuda`, on the GPU.

use super::{adapters, compile_file, output::write_atomic, CompileArgs, Failure};
use indicatif::{ProgressBar, ProgressStyle};
use memc::exec::cpu::CpuExecutor;
use memc::exec::cuda::CudaExecutor;
use memc::exec::io::{read_npy, write_npy, write_safetensors, TensorData};
use memc::exec::{lowp, state, ExecError};
use memc::hf::checkpoint::{self, Wanted};
use memc::ir::DType;
use memc::ops::quant::pack::ErrorSums;
use memc::plan::{human_bytes, verify, BufferId, Plan, VerifiedPlan};

mod input_name;
mod profile;
mod ranks;
mod tiled;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

/// Arguments of `memc run`.
#[derive(clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    compile: CompileArgs,
    /// Number of training steps.
    #[arg(long, default_value_t = 1)]
    steps: u64,
    /// Seed of parameter initialisation, synthetic inputs and dropout masks.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Initial parameter values (names as in the .mdl, dotted for blocks).
    #[arg(long)]
    params: Option<PathBuf>,
    /// Bind an input from a .npy file: --input tokens=tokens.npy (repeatable).
    #[arg(long = "input", value_name = "NAME=FILE")]
    inputs: Vec<String>,
    /// Write the parameters after the last step.
    #[arg(long)]
    save_params: Option<PathBuf>,
    /// Write the run's state after the last step (parameters, optimizer state, the next
    /// step's number and the seed) for --load-state.
    #[arg(long)]
    save_state: Option<PathBuf>,
    /// With --lora: write the trained adapters after the last step as PEFT loads them
    /// (DIR/adapter_model.safetensors and DIR/adapter_config.json).
    #[arg(long, value_name = "DIR")]
    save_adapters: Option<PathBuf>,
    /// With --lora and --save-params: write each adapted weight merged with its adapters
    /// (W + alpha/r · A·B) and no adapters, for the model without --lora.
    #[arg(long, requires = "save_params")]
    merge_adapters: bool,
    /// Continue the run --save-state saved: the same model and options, the same --seed;
    /// the steps continue bitwise as in an uninterrupted run.
    #[arg(long, conflicts_with = "params")]
    load_state: Option<PathBuf>,
    /// After the first step's backward, write loss.npy and grad.<param>.npy here (the
    /// gradients of the loss itself: in fp16 divided by the loss scale).
    #[arg(long)]
    dump: Option<PathBuf>,
    /// With --device cuda: after the steps, run one more timing each plan step's device work
    /// (CUDA events), and print the ops that took longest and the launches per step.
    #[arg(long)]
    profile: bool,
}

fn load_plan(args: &RunArgs) -> Result<VerifiedPlan, Failure> {
    let path = &args.compile.file;
    if path.extension().is_some_and(|e| e == "json") {
        let given = args.compile.compile_options_given();
        if !given.is_empty() {
            return Err(Failure::Plain(format!(
                "{} is a compiled plan, so {} cannot change it; compile the .mdl with {} instead",
                path.display(),
                given.join(", "),
                if given.len() == 1 { "it" } else { "them" }
            )));
        }
        let text = super::read_source(path)?;
        let plan: Plan = serde_json::from_str(&text)
            .map_err(|e| Failure::Plain(format!("{} is not a memc plan: {e}", path.display())))?;
        return verify(plan).map_err(|errs| {
            Failure::Plain(format!(
                "{} fails plan verification: {}",
                path.display(),
                errs.iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("; ")
            ))
        });
    }
    Ok(compile_file(&args.compile)?.plan)
}

/// An executor's buffers as the command sets them: values as f32 (ids as their bit patterns),
/// stored in each buffer's element type by the executor.
trait Buffers {
    fn plan(&self) -> &Plan;
    /// Overwrites a buffer.
    fn set(&mut self, b: BufferId, values: &[f32]) -> Result<(), ExecError>;
    /// Binds an input for every following step (every micro-batch of a step).
    fn bind(&mut self, b: BufferId, values: Vec<f32>) -> Result<(), ExecError>;
    /// Initializes parameters and persistent state and binds synthetic inputs from `seed`
    /// (the values of [`memc::init`], one buffer at a time).
    fn start(&mut self, seed: u64) -> Result<(), ExecError>;
    /// Sets the 1-based number of the next step.
    fn set_step_number(&mut self, t: u64);
    /// The error of the quantized weights written so far, if any.
    fn quantization(&self) -> Option<ErrorSums>;
}

impl Buffers for CpuExecutor {
    fn plan(&self) -> &Plan {
        CpuExecutor::plan(self)
    }
    fn set(&mut self, b: BufferId, values: &[f32]) -> Result<(), ExecError> {
        self.write(b, values)
    }
    fn bind(&mut self, b: BufferId, values: Vec<f32>) -> Result<(), ExecError> {
        self.bind_input(b, values)
    }
    fn start(&mut self, seed: u64) -> Result<(), ExecError> {
        self.set_seed(seed);
        self.init_params(seed)?;
        self.synthetic_inputs(seed)
    }
    fn set_step_number(&mut self, t: u64) {
        CpuExecutor::set_step_number(self, t);
    }
    fn quantization(&self) -> Option<ErrorSums> {
        CpuExecutor::quantization(self)
    }
}

impl Buffers for CudaExecutor {
    fn plan(&self) -> &Plan {
        CudaExecutor::plan(self)
    }
    fn set(&mut self, b: BufferId, values: &[f32]) -> Result<(), ExecError> {
        self.write_values(b, values)
    }
    fn bind(&mut self, b: BufferId, values: Vec<f32>) -> Result<(), ExecError> {
        self.bind_values(b, &values)
    }
    fn start(&mut self, seed: u64) -> Result<(), ExecError> {
        self.set_seed(seed);
        self.init_params(seed)?;
        self.synthetic_inputs(seed)
    }
    fn set_step_number(&mut self, t: u64) {
        CudaExecutor::set_step_number(self, t);
    }
    fn quantization(&self) -> Option<ErrorSums> {
        CudaExecutor::quantization(self)
    }
}

/// Sets the executor's starting state one buffer at a time: parameters and persistent state
/// from the seed (or `--params`, or `--load-state`), inputs synthetic from the seed (or
/// `--input`). Returns the number of the first step to run.
fn prepare(ex: &mut impl Buffers, args: &RunArgs) -> Result<u64, Failure> {
    ex.start(args.seed).map_err(plain)?;
    if let Some(p) = &args.params {
        load_params(ex, p)?;
    }
    let mut first = 1;
    if let Some(path) = &args.load_state {
        let refused =
            |why: String| Failure::Plain(format!("--load-state {}: {why}", path.display()));
        let resume = state::decode(ex.plan(), &read_file(path)?).map_err(refused)?;
        if resume.seed != args.seed {
            return Err(refused(format!(
                "the run was started with --seed {}; pass it again so its inputs and dropout \
                 masks continue",
                resume.seed
            )));
        }
        for (b, values) in &resume.values {
            ex.set(*b, values).map_err(plain)?;
        }
        ex.set_step_number(resume.next_step);
        first = resume.next_step;
    }
    for spec in &args.inputs {
        bind_input(ex, spec)?;
    }
    if let Some(e) = ex.quantization() {
        eprintln!("{}", quantization_line(&e));
    }
    Ok(first)
}

/// The stderr line on the quantized weights as written: their count, packed bytes and
/// error against the f32 values they were packed from.
fn quantization_line(e: &ErrorSums) -> String {
    format!(
        "quantized {} frozen weights into {} bytes ({:.3} bytes per weight): RMS relative \
         error {:.3e}, max abs error {:.3e}",
        e.weights,
        e.packed_bytes,
        e.packed_bytes as f64 / e.weights.max(1) as f64,
        e.rms_relative(),
        e.max_abs_error
    )
}

fn read_file(path: &Path) -> Result<Vec<u8>, Failure> {
    std::fs::read(path).map_err(|e| Failure::Plain(format!("cannot read {}: {e}", path.display())))
}

/// Fills the parameters from a checkpoint (see [`memc::hf::checkpoint`]), saying on stderr
/// how many of its tensors went unused.
fn load_params(ex: &mut impl Buffers, path: &Path) -> Result<(), Failure> {
    let params = ex.plan().params.clone();
    let wanted: Vec<Wanted> = params
        .iter()
        .map(|p| Wanted {
            name: p.name.clone(),
            shape: ex.plan().param_shape(p),
            optional: memc::exec::adapters::is_adapter(&p.name),
        })
        .collect();
    let loaded = checkpoint::load(path, &wanted, |i, values| {
        ex.set(params[i].buffer, &values).map_err(|e| e.to_string())
    })
    .map_err(Failure::Plain)?;
    if let Some(first) = loaded.unused.first() {
        eprintln!(
            "{}: {} tensor(s) no parameter takes, not loaded (first: `{first}`)",
            path.display(),
            loaded.unused.len()
        );
    }
    Ok(())
}

fn bind_input(ex: &mut impl Buffers, spec: &str) -> Result<(), Failure> {
    let Some((name, file)) = spec.split_once('=') else {
        return Err(Failure::Plain(format!(
            "`--input {spec}`: expected NAME=FILE.npy"
        )));
    };
    let Some(binding) = input_name::input_named(ex.plan(), name) else {
        let known: Vec<String> = ex.plan().inputs.iter().map(|i| i.name.clone()).collect();
        return Err(Failure::Plain(format!(
            "`--input {spec}`: the model has no input `{name}` (inputs: {})",
            known.join(", ")
        )));
    };
    let mut want = ex.plan().buffers[binding.buffer.index()].ty.clone();
    // With gradient accumulation a file holds every micro-batch of a step, one after another
    // along the first axis.
    if let Some(first) = want.shape.first_mut() {
        *first *= ex.plan().micro_steps() as usize;
    }
    let data = read_npy(&read_file(Path::new(file))?)
        .map_err(|e| Failure::Plain(format!("{file}: {e}")))?;
    let mismatch = |shape: &[usize], dtype: &str| {
        Failure::Plain(format!(
            "{file}: `{name}` is {dtype}{shape:?}, the model expects {want}"
        ))
    };
    let result = match (data, want.dtype) {
        (TensorData::F32(shape, v), DType::F32) if shape == want.shape => {
            ex.bind(binding.buffer, v)
        }
        (TensorData::I32(shape, v), DType::I32) if shape == want.shape => {
            let out_of_range = |i: i32| {
                Some(i) != binding.id_ignored
                    && (i < 0 || i as u64 >= binding.id_limit.unwrap_or(0))
            };
            if let (Some(limit), Some(bad)) =
                (binding.id_limit, v.iter().find(|&&i| out_of_range(i)))
            {
                let ignored = binding
                    .id_ignored
                    .map_or(String::new(), |k| format!(" and is not the ignored id {k}"));
                return Err(Failure::Plain(format!(
                    "{file}: id {bad} in `{name}` is outside 0..{limit}{ignored}"
                )));
            }
            ex.bind(
                binding.buffer,
                v.iter().map(|&i| f32::from_bits(i as u32)).collect(),
            )
        }
        (TensorData::F32(shape, _), _) => return Err(mismatch(&shape, "f32")),
        (TensorData::I32(shape, _), _) => return Err(mismatch(&shape, "i32")),
    };
    result.map_err(plain)
}

fn dump_file(dir: &Path, name: &str, shape: &[usize], data: &[f32]) -> Result<(), Failure> {
    let bytes =
        write_npy(shape, data).map_err(|e| Failure::Plain(format!("cannot encode {name}: {e}")))?;
    write_atomic(&dir.join(name), &bytes)
}

/// Shows one step's loss on the progress bar, or prints it when stderr is not a terminal.
fn show_loss(bar: Option<&ProgressBar>, step: u64, loss: f32) -> Result<(), Failure> {
    let line = format!("step {step} loss {loss:.6}");
    match bar {
        Some(b) => {
            b.set_message(line);
            b.inc(1);
            Ok(())
        }
        None => super::output::write(None, &format!("{line}\n")),
    }
}

/// The persistent loss scale of an fp16 plan (dynamic loss scaling), if it has one.
fn loss_scale_buffer(plan: &Plan) -> Option<BufferId> {
    plan.buffers
        .iter()
        .find(|b| b.name == "loss_scale" && b.class == memc::plan::BufferClass::OptimState)
        .map(|b| b.id)
}

/// `--dump`'s files after the first step: `grad.<param>.npy` for each gradient the update
/// hook saw, divided by `loss_scale` (the step's loss scale in fp16, else 1: the files hold
/// the gradients of the loss itself), `loss.npy` and `output.<name>.npy` for the plan's
/// outputs.
fn write_dump(
    dir: &Path,
    plan: &Plan,
    (grads, loss_scale): (&[(String, Vec<f32>)], f32),
    outputs: &[(String, Vec<usize>, Vec<f32>)],
) -> Result<(), Failure> {
    for (name, g) in grads {
        let shape = plan
            .params
            .iter()
            .find(|p| p.name == *name)
            .map_or(&[][..], |p| &plan.buffers[p.buffer.index()].ty.shape[..]);
        let unscaled: Vec<f32> = g.iter().map(|v| v / loss_scale).collect();
        dump_file(dir, &format!("grad.{name}.npy"), shape, &unscaled)?;
    }
    for (name, shape, data) in outputs {
        let file = if name == "loss" {
            "loss.npy".to_string()
        } else {
            format!("output.{name}.npy")
        };
        dump_file(dir, &file, shape, data)?;
    }
    Ok(())
}

/// What the run writes after its last step, each buffer read (as f32) through `read`:
/// `--save-state` (`next_step` continues it), `--save-adapters`, and `--save-params` (with
/// `--merge-adapters`, the adapted weights merged and no adapters).
fn save_after(
    args: &RunArgs,
    plan: &Plan,
    next_step: u64,
    read: impl Fn(BufferId) -> Result<Vec<f32>, String>,
) -> Result<(), Failure> {
    if let Some(path) = &args.save_state {
        let bytes = state::encode(plan, args.seed, next_step, &read)
            .map_err(|e| Failure::Plain(format!("cannot save the state: {e}")))?;
        write_atomic(path, &bytes)?;
    }
    let read = |b: BufferId| read(b).map_err(Failure::Plain);
    if let Some(dir) = &args.save_adapters {
        adapters::save(dir, plan, read)?;
    }
    let Some(path) = &args.save_params else {
        return Ok(());
    };
    let tensors = if args.merge_adapters {
        adapters::merged_params(plan, read)?
    } else {
        plan.params
            .iter()
            .map(|p| {
                let shape = plan.param_shape(p);
                Ok((p.name.clone(), shape, read(p.buffer)?))
            })
            .collect::<Result<_, Failure>>()?
    };
    let bytes = write_safetensors(&tensors, None)
        .map_err(|e| Failure::Plain(format!("cannot encode parameters: {e}")))?;
    write_atomic(path, &bytes)
}

fn plain(e: impl std::fmt::Display) -> Failure {
    Failure::Plain(e.to_string())
}

/// Runs the steps on the GPU, its arena filled one buffer at a time.
fn run_cuda(args: &RunArgs, plan: &VerifiedPlan, bar: Option<&ProgressBar>) -> Result<(), Failure> {
    let mut dev = CudaExecutor::new(plan).map_err(plain)?;
    let first = prepare(&mut dev, args)?;
    let plan = plan.plan();
    let dtype = |b: BufferId| plan.buffers[b.index()].ty.dtype;
    let (before, after) = dev.memory;
    let used = |m: memc::exec::cuda::MemInfo| human_bytes(m.total - m.free);
    let allocation = match plan.train.as_ref().is_some_and(|t| t.unified) {
        true => "one managed allocation (unified memory)",
        false => "one allocation",
    };
    let host = match plan.host_bytes {
        0 => String::new(),
        bytes => format!("; host arena {} page-locked", human_bytes(bytes)),
    };
    super::output::write(
        None,
        &format!(
            "cuda: arena {} in {allocation}{host}; device memory in use {} -> {} of {}\n",
            human_bytes(plan.arena_bytes),
            used(before),
            used(after),
            human_bytes(after.total)
        ),
    )?;
    if let Some(d) = plan.report.device {
        let in_use = after.total - after.free;
        super::output::write(
            None,
            &format!(
                "cuda: {in_use} bytes in use against the plan's {} (arena + context reserve): {:.3} of it\n",
                d.total,
                in_use as f64 / d.total.max(1) as f64
            ),
        )?;
    }
    let loss = plan
        .outputs
        .iter()
        .find(|(n, _)| n == "loss")
        .map(|&(_, b)| b);
    // Wall time of the steps after the first (which pays the module loads' first use);
    // reading the loss waits for the step's kernels.
    let mut after_first = std::time::Duration::ZERO;
    for step in 1..=args.steps {
        let start = std::time::Instant::now();
        let mut dumped: Vec<(String, Vec<f32>)> = Vec::new();
        let mut hook = |name: &str, g: &[f32]| dumped.push((name.to_string(), g.to_vec()));
        let want_dump = step == 1 && args.dump.is_some();
        let scale = match loss_scale_buffer(plan) {
            Some(b) if want_dump => lowp::from_bytes(DType::F32, &dev.read(b).map_err(plain)?)
                .first()
                .copied()
                .unwrap_or(1.0),
            _ => 1.0,
        };
        dev.run_step(if want_dump { Some(&mut hook) } else { None })
            .map_err(|e| Failure::Plain(format!("step {step}: {e}")))?;
        if let Some(b) = loss {
            let value = lowp::from_bytes(dtype(b), &dev.read(b).map_err(plain)?);
            let number = first + step - 1;
            show_loss(bar, number, value.first().copied().unwrap_or(f32::NAN))?;
        }
        if step > 1 {
            after_first += start.elapsed();
        }
        if let (Some(dir), true) = (&args.dump, step == 1) {
            let mut outputs = Vec::new();
            for (name, b) in &plan.outputs {
                let data = lowp::from_bytes(dtype(*b), &dev.read(*b).map_err(plain)?);
                outputs.push((name.clone(), plan.buffers[b.index()].ty.shape.clone(), data));
            }
            write_dump(dir, plan, (&dumped, scale), &outputs)?;
        }
    }
    if let Some(why) = dev.graph_failure() {
        let line = format!("cuda: steps ran launch by launch, as no CUDA Graph could: {why}\n");
        super::output::write(None, &line)?;
    }
    if args.steps > 1 {
        super::output::write(
            None,
            &format!(
                "cuda: {:.3} ms per step after the first, over {} steps\n",
                after_first.as_secs_f64() * 1e3 / (args.steps - 1) as f64,
                args.steps - 1
            ),
        )?;
    }
    if args.profile {
        let times = dev
            .profile_step()
            .map_err(|e| Failure::Plain(format!("profiled step: {e}")))?;
        super::output::write(None, &profile::table(plan, &times, dev.launches_per_step()))?;
    }
    save_after(args, plan, first + args.steps, |b| {
        dev.read_values(b).map_err(|e| e.to_string())
    })?;
    Ok(())
}

/// Runs the command.
pub fn run(args: RunArgs) -> Result<(), Failure> {
    if args.compile.tile.is_some() {
        return tiled::run(&args);
    }
    let cuda = args.compile.device == "cuda";
    if cuda && args.compile.parallel.is_some() {
        return Err(Failure::Plain(memc::exec::PARALLEL_ON_CUDA.into()));
    }
    if cuda && !memc::exec::cuda::driver_present() {
        return Err(Failure::Plain(
            "no CUDA driver found; use --device cpu".into(),
        ));
    }
    let plan = load_plan(&args)?;
    for (asked, flag) in [
        (args.save_adapters.is_some(), "--save-adapters"),
        (args.merge_adapters, "--merge-adapters"),
    ] {
        if asked {
            adapters::lora(plan.plan(), flag)?;
        }
    }
    if plan.plan().train.is_none() && args.steps > 1 {
        return Err(Failure::Plain(
            "an inference plan runs one step; drop --steps".into(),
        ));
    }
    if let Some(dir) = &args.dump {
        std::fs::create_dir_all(dir)
            .map_err(|e| Failure::Plain(format!("cannot create {}: {e}", dir.display())))?;
    }
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = ProgressBar::new(args.steps);
        b.set_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} {per_sec} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b
    });
    if plan.plan().report.parallel.is_some() && !cuda {
        ranks::run(&args, &plan, bar.as_ref())?;
    } else if cuda {
        run_cuda(&args, &plan, bar.as_ref())?;
    } else {
        let mut ex = CpuExecutor::new(&plan).map_err(plain)?;
        let first = prepare(&mut ex, &args)?;
        run_cpu(&args, &mut ex, first, bar.as_ref())?;
    }
    if let Some(b) = bar {
        b.finish();
    }
    Ok(())
}

/// Runs the steps on the CPU, numbering them from `first`.
fn run_cpu(
    args: &RunArgs,
    ex: &mut CpuExecutor,
    first: u64,
    bar: Option<&ProgressBar>,
) -> Result<(), Failure> {
    for step in 1..=args.steps {
        let mut dumped: Vec<(String, Vec<f32>)> = Vec::new();
        let mut hook = |name: &str, g: &[f32]| dumped.push((name.to_string(), g.to_vec()));
        let want_dump = step == 1 && args.dump.is_some();
        let scale = match loss_scale_buffer(ex.plan()) {
            Some(b) if want_dump => ex.read(b)[0],
            _ => 1.0,
        };
        ex.run_step(if want_dump { Some(&mut hook) } else { None })
            .map_err(|e| Failure::Plain(format!("step {step}: {e}")))?;
        let outputs: Vec<(String, Vec<usize>, Vec<f32>)> = ex
            .plan()
            .outputs
            .iter()
            .map(|(n, b)| {
                (
                    n.clone(),
                    ex.plan().buffers[b.index()].ty.shape.clone(),
                    ex.read(*b).to_vec(),
                )
            })
            .collect();
        if let (Some(dir), true) = (&args.dump, step == 1) {
            write_dump(dir, ex.plan(), (&dumped, scale), &outputs)?;
        }
        if let Some((_, _, loss)) = outputs.iter().find(|(n, _, _)| n == "loss") {
            show_loss(bar, first + step - 1, loss[0])?;
        }
    }
    save_after(args, ex.plan(), first + args.steps, |b| {
        Ok(ex.read(b).to_vec())
    })?;
    Ok(())
}
