//! Runs the generated CUDA kernels on the CPU through the g++ host shim
//! (`kernels/sim/cuda_sim.h`) and compares them with the CPU backend: every op case of
//! `tests/cuda_cases` in f32, f16 and bf16, the casts, and whole training steps of tiny
//! GPT-2, Llama and MLP plans launched kernel by kernel over one arena in plan order.
//! Without g++ the tests print SKIP.
//!
//! Each op case also runs with blocks and threads in reverse order and must give bit-identical
//! results (a race between threads or blocks would not).
//!
//! Tolerances: an element passes when |shim - cpu| <= rtol * (|cpu| + 0.1 * max|cpu|), with
//! rtol = 1e-4 for f32 outputs and two units of the format's epsilon for 16-bit outputs
//! (f16: 2^-9, bf16: 2^-6): the 16-bit kernels compute in fp32 from the same rounded inputs
//! as the f32 reference and round once on store, so they may land one ulp away.
#![allow(
    clippy::panic,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used
)]

mod common;
mod cuda_cases;

use cuda_cases::*;
use half::{bf16, f16};
use memc::codegen::{cast_kernel, plan_kernel_uses, Kernel, KernelParam};
use memc::exec::cpu::CpuExecutor;
use memc::exec::kernels::{reduce, rng};
use memc::front::train::Precision;
use memc::ir::{DType, Graph, Op, Origin, Phase, Span, TensorType};
use memc::plan::{build, verify, BuildOptions, Plan};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

const SIM_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels/sim");
const ALIGN: u64 = 256;
/// The byte the shim's arenas start filled with outside initialized tensors.
const POISON: u8 = 0xff;
/// The 1-based training step passed to every launch (exercises SGD momentum and AdamW bias
/// correction past the first step in the op cases).
const CASE_STEP: u64 = 3;

/// Why the shim cannot run here, if it cannot.
fn gxx_missing() -> Option<String> {
    match Command::new("g++").arg("--version").output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "g++ --version failed: {}",
            String::from_utf8_lossy(&o.stderr)
        )),
        Err(e) => Some(format!("g++ not found: {e}")),
    }
}

/// `f` over `items` on up to `available_parallelism` threads, results in item order.
fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<R>>> =
        items.iter().map(|_| std::sync::Mutex::new(None)).collect();
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..workers.min(items.len()) {
            s.spawn(|| {
                let mut i = next.fetch_add(1, Ordering::Relaxed);
                while let Some(item) = items.get(i) {
                    *results[i].lock().unwrap() = Some(f(item));
                    i = next.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    results
        .into_iter()
        .map(|m| m.into_inner().unwrap().expect("every item ran"))
        .collect()
}

/// Compiles `kernel` with its launcher into an executable in `dir`.
fn compile(kernel: &Kernel, dir: &Path) -> Result<PathBuf, String> {
    let args: Vec<String> = (0..kernel.params.len() - 1)
        .map(|i| format!("a[{i}]"))
        .collect();
    let main = format!(
        "#include \"cuda_sim.h\"\n#include \"{name}.cu\"\n\
         int main(int argc, char** argv) {{\n    return memc_sim::run_main(argc, argv, {n}, \
         [](char* arena, const unsigned long long* a) {{ {entry}(arena{sep}{args}); }});\n}}\n",
        name = kernel.name,
        n = args.len(),
        entry = kernel.entry,
        sep = if args.is_empty() { "" } else { ", " },
        args = args.join(", "),
    );
    let cu = dir.join(format!("{}.cu", kernel.name));
    let cpp = dir.join(format!("{}.cpp", kernel.name));
    let exe = dir.join(&kernel.name);
    std::fs::write(&cu, &kernel.source).map_err(|e| e.to_string())?;
    std::fs::write(&cpp, main).map_err(|e| e.to_string())?;
    let out = Command::new("g++")
        .args(["-std=c++17", "-O1", "-Wno-unknown-pragmas", "-I", SIM_DIR])
        .arg(&cpp)
        .arg("-o")
        .arg(&exe)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "g++ failed on {}:\n{}",
            kernel.name,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(exe)
}

/// Runs one launch of `kernel` over the arena file with the given values for its params.
/// `reverse` runs blocks and threads in reverse order (see `cuda_sim.h`).
fn launch(
    exe: &Path,
    kernel: &Kernel,
    arena: &Path,
    reverse: bool,
    value: impl Fn(KernelParam) -> u64,
) -> Result<(), String> {
    let geometry = kernel.grid.iter().chain(&kernel.block).map(u32::to_string);
    let args = kernel.params[1..].iter().map(|&p| value(p).to_string());
    let mut cmd = Command::new(exe);
    if reverse {
        cmd.env("MEMC_SIM_REVERSE", "1");
    }
    let out = cmd
        .arg(arena)
        .args(geometry)
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} exited with {}: {}",
            kernel.name,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn round_to(dtype: DType, v: f32) -> f32 {
    match dtype {
        DType::F16 => f16::from_f32(v).to_f32(),
        DType::BF16 => bf16::from_f32(v).to_f32(),
        _ => v,
    }
}

/// Stores `values` (ids as their integer values) at byte `off` as `dtype`.
fn put(arena: &mut [u8], off: u64, dtype: DType, values: &[f32]) {
    let size = dtype.size() as usize;
    for (i, &v) in values.iter().enumerate() {
        let at = off as usize + i * size;
        let dst = &mut arena[at..at + size];
        match dtype {
            DType::F32 => dst.copy_from_slice(&v.to_le_bytes()),
            DType::F16 => dst.copy_from_slice(&f16::from_f32(v).to_le_bytes()),
            DType::BF16 => dst.copy_from_slice(&bf16::from_f32(v).to_le_bytes()),
            DType::I32 => dst.copy_from_slice(&(v as i32).to_le_bytes()),
        }
    }
}

/// Reads `n` elements of `dtype` at byte `off` as f32.
fn get(arena: &[u8], off: u64, dtype: DType, n: usize) -> Vec<f32> {
    let size = dtype.size() as usize;
    (0..n)
        .map(|i| {
            let at = off as usize + i * size;
            let b = &arena[at..at + size];
            match dtype {
                DType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                DType::F16 => f16::from_le_bytes([b[0], b[1]]).to_f32(),
                DType::BF16 => bf16::from_le_bytes([b[0], b[1]]).to_f32(),
                DType::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32,
            }
        })
        .collect()
}

/// Seeded input data for `op` at the given (possibly 16-bit) input types, exactly
/// representable in them: ids below the op's limit, floats standard normal except where the
/// op needs otherwise (positive second moments and divisors, y = max_to(x)).
fn case_data(op: &Op, inputs: &[TensorType], seed: u64) -> Vec<Vec<f32>> {
    let mut data: Vec<Vec<f32>> = Vec::new();
    for (i, ty) in inputs.iter().enumerate() {
        let n = ty.numel() as usize;
        let key = seed.wrapping_mul(31).wrapping_add(i as u64);
        let values: Vec<f32> = if ty.dtype == DType::I32 {
            let limit = match op {
                Op::Embedding => inputs[0].shape[0],
                Op::EmbeddingBackward { rows } => *rows,
                _ => inputs[0].shape.last().copied().unwrap_or(1),
            };
            (0..n)
                .map(|j| (rng::uniform01(key, 0, j as u64) * limit as f32).floor())
                .collect()
        } else if let (Op::MaxToBackward, 1) = (op, i) {
            let mut y = vec![0.0; n];
            reduce::max_to(&data[0], &inputs[0].shape, &mut y, &ty.shape);
            y
        } else {
            let positive = matches!(
                (op, i),
                (Op::AdamW(_), 3 | 4) | (Op::Sgd(_), 3) | (Op::Binary(_), 1)
            );
            (0..n)
                .map(|j| {
                    let v = rng::normal01(key, 0, j as u64);
                    if positive {
                        v.abs() + 0.5
                    } else {
                        v
                    }
                })
                .collect()
        };
        data.push(values.iter().map(|&v| round_to(ty.dtype, v)).collect());
    }
    data
}

/// What a step produced: its output (if it has one) and its in-place updated inputs.
#[derive(Debug)]
struct Results {
    output: Option<Vec<f32>>,
    updated: Vec<(usize, Vec<f32>)>,
}

impl Results {
    /// Every value's bits, in order.
    fn bits(&self) -> Vec<u32> {
        let updated = self.updated.iter().flat_map(|(_, v)| v);
        self.output
            .iter()
            .flatten()
            .chain(updated)
            .map(|v| v.to_bits())
            .collect()
    }
}

fn origin(phase: Phase) -> Origin {
    Origin {
        span: Span { start: 0, end: 0 },
        scope: String::new(),
        phase,
    }
}

/// The CPU backend on a one-step plan of `op` over f32/i32 `inputs` holding `data`.
fn cpu_reference(op: &Op, inputs: &[TensorType], data: &[Vec<f32>], step: u64) -> Results {
    let mut g = Graph::new();
    let ins = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let input = Op::Input {
                name: format!("in{i}"),
                ty: t.clone(),
            };
            g.add(input, vec![], &origin(Phase::Forward)).unwrap()
        })
        .collect();
    let phase = if op.mutated_inputs().is_empty() {
        Phase::Forward
    } else {
        Phase::Update
    };
    let v = g.add(op.clone(), ins, &origin(phase)).unwrap();
    if g.node(v).ty.bytes() > 0 {
        g.outputs.push(("out".to_string(), v));
    }
    let options = BuildOptions {
        optimizer_in_backward: false,
        layout_time: std::time::Duration::from_millis(10),
        alignment: ALIGN,
    };
    let plan = verify(build("case", &g, None, &options).unwrap()).unwrap();
    let mut ex = CpuExecutor::new(&plan).unwrap();
    let buffer = |i: usize| plan.plan().inputs[i].buffer;
    for (i, values) in data.iter().enumerate() {
        assert_eq!(plan.plan().inputs[i].name, format!("in{i}"));
        if inputs[i].dtype == DType::I32 {
            let ids: Vec<i32> = values.iter().map(|&v| v as i32).collect();
            ex.bind_ids(buffer(i), &ids).unwrap();
        } else {
            ex.bind_input(buffer(i), values.clone()).unwrap();
        }
    }
    ex.set_step_number(step);
    ex.run_step(None).unwrap();
    Results {
        output: ex.output("out").map(std::borrow::Cow::into_owned),
        updated: op
            .mutated_inputs()
            .iter()
            .map(|&i| (i, ex.read(buffer(i)).to_vec()))
            .collect(),
    }
}

/// The kernel of `op` over `inputs` run through the shim on an arena holding `data`.
fn shim_run(
    exe: &Path,
    kernel: &Kernel,
    (inputs, output): (&[TensorType], &TensorType),
    data: &[Vec<f32>],
    mutated: &[usize],
    arena_file: &Path,
    reverse: bool,
) -> Result<Results, String> {
    // Each tensor is followed by at least one guard block; the arena starts as POISON bytes
    // (NaN in every float type), so an unwritten output element fails the comparison and a
    // write outside a tensor shows in the guards.
    let mut offsets = Vec::new();
    let mut end = 0u64;
    for t in inputs.iter().chain(std::iter::once(output)) {
        offsets.push(end);
        end += (t.bytes().div_ceil(ALIGN) + 1) * ALIGN;
    }
    let mut arena = vec![POISON; end as usize];
    for (i, values) in data.iter().enumerate() {
        put(&mut arena, offsets[i], inputs[i].dtype, values);
    }
    std::fs::write(arena_file, &arena).map_err(|e| e.to_string())?;
    launch(exe, kernel, arena_file, reverse, |p| match p {
        KernelParam::Arena => 0,
        KernelParam::Input(i) => offsets[i],
        KernelParam::Output => offsets[inputs.len()],
        KernelParam::Step | KernelParam::Stream => CASE_STEP,
        // The CPU reference runs one micro-step: the first.
        KernelParam::MicroStep => 0,
    })?;
    let after = std::fs::read(arena_file).map_err(|e| e.to_string())?;
    let types = inputs.iter().chain(std::iter::once(output));
    for ((t, &at), next) in types.zip(&offsets).zip(offsets[1..].iter().chain([&end])) {
        let guard = (at + t.bytes()) as usize..*next as usize;
        if after[guard.clone()] != arena[guard.clone()] {
            return Err(format!(
                "the kernel wrote outside its tensors (bytes {guard:?})"
            ));
        }
    }
    let arena = after;
    let read = |off: u64, t: &TensorType| get(&arena, off, t.dtype, t.numel() as usize);
    Ok(Results {
        output: (output.bytes() > 0).then(|| read(offsets[inputs.len()], output)),
        updated: mutated
            .iter()
            .map(|&i| (i, read(offsets[i], &inputs[i])))
            .collect(),
    })
}

/// Relative tolerance for values stored as `dtype` (see the file comment).
fn rtol(dtype: DType) -> f32 {
    match dtype {
        DType::F16 => 2f32.powi(-9),
        DType::BF16 => 2f32.powi(-6),
        _ => 1e-4,
    }
}

/// Largest |got - want| over the tensor, and the largest ratio of error to allowed error
/// (the tensor passes when that ratio is at most 1).
fn compare(got: &[f32], want: &[f32], dtype: DType) -> (f32, f32) {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    got.iter()
        .zip(want)
        .fold((0f32, 0f32), |(max_err, max_ratio), (&g, &w)| {
            if g.is_nan() && w.is_nan() {
                return (max_err, max_ratio);
            }
            let err = (g - w).abs();
            let allowed = rtol(dtype) * (w.abs() + 0.1 * scale) + f32::MIN_POSITIVE;
            let ratio = if err.is_nan() {
                f32::INFINITY
            } else {
                err / allowed
            };
            (max_err.max(err), max_ratio.max(ratio))
        })
}

/// One op case at one dtype.
type Case = KernelCase;

/// Every op case in f32, f16 and bf16; ops on f32 scalars only (the loss-scale update) give
/// one kernel for every dtype: it is run once.
fn all_cases() -> Vec<Case> {
    let mut out: Vec<Case> = Vec::new();
    for case in kernel_cases() {
        if !out.iter().any(|c| c.kernel.name == case.kernel.name) {
            out.push(case);
        }
    }
    out
}

/// Compiles, runs and compares one case; returns (max error, max error ratio).
fn run_case(case: &Case, dir: &Path) -> Result<(f32, f32), String> {
    let exe = compile(&case.kernel, dir)?;
    let data = case_data(&case.op, &case.inputs, 7);
    let want = cpu_reference(&case.f32_op, &case.f32_inputs, &data, CASE_STEP);
    let arena = dir.join(format!("{}.arena", case.kernel.name));
    let run = |reverse| {
        shim_run(
            &exe,
            &case.kernel,
            (&case.inputs, &case.output),
            &data,
            case.op.mutated_inputs(),
            &arena,
            reverse,
        )
    };
    let got = run(false)?;
    if run(true)?.bits() != got.bits() {
        return Err("the result depends on the order of threads or blocks (a race)".to_string());
    }
    compare_results(&got, &want, &case.output, &case.inputs)
}

/// (max error, max error ratio) over a step's output and updated inputs.
fn compare_results(
    got: &Results,
    want: &Results,
    output: &TensorType,
    inputs: &[TensorType],
) -> Result<(f32, f32), String> {
    let mut pairs = Vec::new();
    if let (Some(g), Some(w)) = (&got.output, &want.output) {
        pairs.push((g, w, output.dtype));
    } else if got.output.is_some() != want.output.is_some() {
        return Err("output presence differs".to_string());
    }
    for ((i, g), (_, w)) in got.updated.iter().zip(&want.updated) {
        pairs.push((g, w, inputs[*i].dtype));
    }
    if pairs.is_empty() {
        return Err("nothing to compare".to_string());
    }
    Ok(pairs
        .into_iter()
        .map(|(g, w, dt)| compare(g, w, dt))
        .fold((0f32, 0f32), |a, b| (a.0.max(b.0), a.1.max(b.1))))
}

#[test]
fn every_kernel_family_matches_the_cpu_backend_through_the_shim() {
    if let Some(why) = gxx_missing() {
        println!("SKIP: {why}");
        return;
    }
    let start = std::time::Instant::now();
    let dir = tempfile::tempdir().expect("temp dir");
    let cases = all_cases();
    let results = par_map(&cases, |c| run_case(c, dir.path()));
    let mut failures = Vec::new();
    let mut summary: HashMap<DType, (usize, f32, f32)> = HashMap::new();
    for (case, r) in cases.iter().zip(&results) {
        match r {
            Ok((err, ratio)) if *ratio <= 1.0 => {
                let s = summary.entry(case.dtype).or_default();
                *s = (s.0 + 1, s.1.max(*err), s.2.max(*ratio));
            }
            Ok((err, ratio)) => failures.push(format!(
                "{}: max error {err:e} is {ratio:.1}x the tolerance",
                case.label
            )),
            Err(e) => failures.push(format!("{}: {e}", case.label)),
        }
    }
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let (n, err, ratio) = summary.get(&dtype).copied().unwrap_or_default();
        println!(
            "{dtype}: {n} kernels match the CPU backend (max abs error {err:e}, \
             {ratio:.3} of the tolerance)"
        );
    }
    println!("{} cases in {:.1?}", cases.len(), start.elapsed());
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// Inputs for the cast kernels: ties, overflow to infinity, subnormals, signed zero, NaN and
/// infinities, then normals over many magnitudes.
fn cast_inputs(n: usize) -> Vec<f32> {
    let ulp16 = 2f32.powi(-11);
    let mut xs = vec![
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        65504.0,
        65519.0,
        65520.0,
        -65520.0,
        1.0 + ulp16,
        1.0 + 3.0 * ulp16,
        1.0 + 2f32.powi(-8),
        1.0 + 3.0 * 2f32.powi(-8),
        2f32.powi(-24),
        2f32.powi(-25),
        1.5 * 2f32.powi(-25),
        1e-7,
        -3e-6,
        6.1e-5,
        3.3e38,
        f32::MAX,
        f32::MIN_POSITIVE,
    ];
    let magnitudes = n - xs.len();
    xs.extend((0..magnitudes).map(|i| {
        let exp = (i % 60) as i32 - 30;
        rng::normal01(11, 0, i as u64) * 2f32.powi(exp)
    }));
    xs
}

#[test]
fn cast_kernels_round_like_the_half_crate() {
    if let Some(why) = gxx_missing() {
        println!("SKIP: {why}");
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let floats = [DType::F32, DType::F16, DType::BF16];
    let pairs: Vec<(DType, DType)> = floats
        .iter()
        .flat_map(|&a| floats.iter().map(move |&b| (a, b)))
        .filter(|(a, b)| a != b)
        .collect();
    let n = 1000;
    let results = par_map(&pairs, |&(from, to)| {
        let kernel = cast_kernel(from, to, n as u64);
        let exe = compile(&kernel, dir.path())?;
        let (tin, tout) = (TensorType::new(from, vec![n]), TensorType::new(to, vec![n]));
        let xs: Vec<f32> = cast_inputs(n).iter().map(|&v| round_to(from, v)).collect();
        let arena = dir.path().join(format!("{}.arena", kernel.name));
        let got = shim_run(
            &exe,
            &kernel,
            (&[tin], &tout),
            std::slice::from_ref(&xs),
            &[],
            &arena,
            false,
        )?;
        let got = got.output.ok_or("no output")?;
        let bad = xs
            .iter()
            .zip(&got)
            .filter(|(&x, &g)| {
                let want = round_to(to, x);
                !(want.to_bits() == g.to_bits() || (want.is_nan() && g.is_nan()))
            })
            .map(|(x, g)| format!("{x:e} -> {g:e}"))
            .collect::<Vec<_>>();
        if bad.is_empty() {
            Ok(())
        } else {
            Err(format!("{from}->{to}: {}", bad.join(", ")))
        }
    });
    let failures: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    println!(
        "casts: {} of {} kernels bit-exact",
        pairs.len() - failures.len(),
        pairs.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// An example model compiled with the given dims.
fn example(name: &str, dims: &[(&str, i64)], precision: Precision) -> memc::Compiled {
    let path = format!("{}/examples/{name}.mdl", env!("CARGO_MANIFEST_DIR"));
    let src = std::fs::read_to_string(&path).expect("example");
    common::compiled_with(
        &src,
        &memc::Options {
            overrides: dims.iter().map(|&(k, v)| (k.to_string(), v)).collect(),
            precision: Some(precision),
            ..Default::default()
        },
    )
}

/// A whole plan step run through the shim.
struct PlanRun {
    /// Each parameter's gradient as read just before its update.
    grads: HashMap<String, Vec<f32>>,
    /// The largest error ratio of one step's results against the CPU backend's kernel on
    /// the same inputs, and which step.
    worst_step: (f32, String),
    /// Distinct kernels launched.
    kernels: usize,
}

/// Runs every step of `plan` in order through the shim over `arena` (in place, as a file in
/// `dir`), checking each step against the CPU backend's kernel on the same inputs.
fn shim_plan_step(plan: &Plan, arena: &mut Vec<u8>, dir: &Path) -> Result<PlanRun, String> {
    let uses = plan_kernel_uses(plan).map_err(|e| e.to_string())?;
    let exes = par_map(&uses, |(k, _)| compile(k, dir));
    let mut kernel_of = vec![None; plan.steps.len()];
    for ((kernel, steps), exe) in uses.iter().zip(&exes) {
        let exe = exe.as_ref().map_err(Clone::clone)?;
        for &s in steps {
            kernel_of[s] = Some((kernel, exe));
        }
    }
    let file = dir.join("plan.arena");
    std::fs::write(&file, &*arena).map_err(|e| e.to_string())?;
    let buffer = |b: memc::plan::BufferId| &plan.buffers[b.index()];
    let read = |bytes: &[u8], b| {
        let buf = buffer(b);
        get(bytes, buf.offset, buf.ty.dtype, buf.ty.numel() as usize)
    };
    let mut run = PlanRun {
        grads: HashMap::new(),
        worst_step: (0.0, String::new()),
        kernels: uses.len(),
    };
    for (s, step) in plan.steps.iter().enumerate() {
        let types: Vec<TensorType> = step.inputs.iter().map(|&b| buffer(b).ty.clone()).collect();
        let data: Vec<Vec<f32>> = step.inputs.iter().map(|&b| read(arena, b)).collect();
        if let Op::AdamW(_) | Op::Sgd(_) = step.op {
            let name = plan
                .params
                .iter()
                .find(|p| p.buffer == step.inputs[0])
                .map(|p| p.name.clone())
                .ok_or("update of a non-parameter")?;
            run.grads.insert(name, data[1].clone());
        }
        let (kernel, exe) = kernel_of[s].ok_or_else(|| format!("step {s} has no kernel"))?;
        launch(exe, kernel, &file, false, |p| match p {
            KernelParam::Arena => 0,
            KernelParam::Input(i) => buffer(step.inputs[i]).offset,
            KernelParam::Output => step.output.map_or(0, |b| buffer(b).offset),
            KernelParam::Step | KernelParam::Stream => 1,
            KernelParam::MicroStep => 0,
        })?;
        *arena = std::fs::read(&file).map_err(|e| e.to_string())?;
        let got = Results {
            output: step.output.map(|b| read(arena, b)),
            updated: step
                .op
                .mutated_inputs()
                .iter()
                .map(|&i| (i, read(arena, step.inputs[i])))
                .collect(),
        };
        let want = cpu_reference(&step.op, &types, &data, 1);
        let out_ty = step
            .output
            .map_or_else(|| types[0].clone(), |b| buffer(b).ty.clone());
        let (_, ratio) = compare_results(&got, &want, &out_ty, &types)
            .map_err(|e| format!("step {s} ({}): {e}", step.op.name()))?;
        if ratio >= run.worst_step.0 {
            run.worst_step = (ratio, format!("step {s} ({})", step.op.name()));
        }
    }
    Ok(run)
}

#[test]
fn small_training_steps_through_the_shim_match_the_cpu_backend() {
    if let Some(why) = gxx_missing() {
        println!("SKIP: {why}");
        return;
    }
    // GPT-2 (learned positions, layernorm, gelu MLP, causal attention, tied embeddings;
    // AdamW), Llama (rmsnorm, rope, silu gating) and the MLP (SGD), all tiny.
    let gpt2 = [("B", 2), ("T", 8), ("D", 32), ("H", 2), ("V", 64), ("L", 2)];
    let llama = [
        ("B", 1),
        ("T", 8),
        ("D", 32),
        ("H", 2),
        ("V", 64),
        ("L", 1),
        ("F", 48),
    ];
    let mlp = [("B", 4), ("H", 32)];
    for (name, dims) in [("gpt2", &gpt2[..]), ("llama7b", &llama), ("mlp", &mlp)] {
        training_step_matches(name, &example(name, dims, Precision::Fp32), DType::F32);
    }
    // Mixed precision: bf16 (casts, bf16 matmul/attention) and fp16 (plus loss scaling).
    // Gradients pass through 16-bit tensors, so they get the tolerance of that format.
    for (precision, dtype) in [
        (Precision::Bf16, DType::BF16),
        (Precision::Fp16, DType::F16),
    ] {
        training_step_matches("gpt2", &example("gpt2", &gpt2, precision), dtype);
    }
}

/// Runs one training step of `c` through the shim, kernel by kernel in plan order over one
/// arena, and checks every step's results against the CPU backend's kernel on the same
/// inputs, then the loss, gradients and updated parameters against a CPU backend step.
fn training_step_matches(name: &str, c: &memc::Compiled, grad_tolerance: DType) {
    let start = std::time::Instant::now();
    let plan = c.plan.plan();
    let mut ex = common::executor(c, 5);
    // The arena before the step: parameters, zeroed optimizer state and bound inputs (the
    // CPU plan's buffers are all 4-byte words; ids are stored as their bit patterns); every
    // other byte is POISON, so a kernel reading a buffer before it is written yields NaN.
    let mut arena = vec![POISON; plan.arena_bytes as usize];
    for b in plan
        .params
        .iter()
        .map(|p| p.buffer)
        .chain(plan.inputs.iter().map(|i| i.buffer))
        .chain(plan.optim_state.iter().map(|s| s.buffer))
    {
        let at = plan.buffers[b.index()].offset as usize;
        for (i, w) in ex.read(b).iter().enumerate() {
            arena[at + 4 * i..at + 4 * i + 4].copy_from_slice(&w.to_le_bytes());
        }
    }
    let mut want = HashMap::new();
    ex.run_step(Some(&mut |name: &str, g: &[f32]| {
        want.insert(name.to_string(), g.to_vec());
    }))
    .expect("cpu step");
    let dir = tempfile::tempdir().expect("temp dir");
    let run =
        shim_plan_step(plan, &mut arena, dir.path()).unwrap_or_else(|e| panic!("{name}: {e}"));

    let (_, loss_buf) = plan
        .outputs
        .iter()
        .find(|(n, _)| n == "loss")
        .expect("loss");
    let loss_at = plan.buffers[loss_buf.index()].offset;
    let (shim_loss, cpu_loss) = (
        get(&arena, loss_at, DType::F32, 1)[0],
        ex.output("loss").expect("loss")[0],
    );
    assert_eq!(
        run.grads.len(),
        plan.params.len(),
        "{name}: every parameter gets a gradient"
    );
    // Gradients: the f32 tolerance. Updated parameters: within lr / 30 absolutely, since
    // AdamW's first step normalizes each gradient element, so where a gradient is pure
    // rounding noise (the key bias: softmax ignores a constant shift) only the absolute
    // change is meaningful.
    let lr = plan
        .steps
        .iter()
        .find_map(|s| match &s.op {
            Op::AdamW(h) => Some(h.lr),
            Op::Sgd(h) => Some(h.lr),
            _ => None,
        })
        .expect("a training plan has updates");
    let mut worst = (0f32, 0f32, String::new());
    let mut worst_param = (0f32, String::new());
    for p in &plan.params {
        let (err, ratio) = compare(&run.grads[&p.name], &want[&p.name], grad_tolerance);
        if ratio >= worst.1 {
            worst = (err, ratio, p.name.clone());
        }
        let buf = &plan.buffers[p.buffer.index()];
        let after = get(&arena, buf.offset, DType::F32, buf.ty.numel() as usize);
        let perr = after
            .iter()
            .zip(ex.read(p.buffer).iter())
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        if perr >= worst_param.0 {
            worst_param = (perr, p.name.clone());
        }
    }
    println!(
        "{name}: {} steps, {} kernels; worst {} ({:.3} of the tolerance); loss shim \
         {shim_loss} cpu {cpu_loss}; {} gradients, worst {} (max error {:e}, {:.3} of the \
         tolerance); worst updated parameter {} (max error {:e}); {:.1?}",
        plan.steps.len(),
        run.kernels,
        run.worst_step.1,
        run.worst_step.0,
        plan.params.len(),
        worst.2,
        worst.0,
        worst.1,
        worst_param.1,
        worst_param.0,
        start.elapsed()
    );
    assert!(
        run.worst_step.0 <= 1.0,
        "{name}: {} differs from the CPU kernel",
        run.worst_step.1
    );
    assert!(
        (shim_loss - cpu_loss).abs() <= 1e-4 * cpu_loss.abs(),
        "{name}: loss {shim_loss} vs {cpu_loss}"
    );
    assert!(
        worst.1 <= 1.0,
        "{name}: gradient of {} off by {:e}",
        worst.2,
        worst.0
    );
    assert!(
        worst_param.0 <= lr / 30.0,
        "{name}: updated {} off by {:e}",
        worst_param.1,
        worst_param.0
    );
}
