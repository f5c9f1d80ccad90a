//! The shim harness: compiles generated kernels with g++ against `kernels/sim/cuda_sim.h`,
//! launches them over an arena file, encodes and decodes arena bytes per dtype, seeds op
//! inputs, runs the CPU backend on the same inputs, and compares within per-dtype
//! tolerances (see `tests/shim.rs` for the rules).
pub mod cases;

use half::{bf16, f16};
use memc::codegen::{Kernel, KernelParam};
use memc::exec::cpu::CpuExecutor;
use memc::exec::kernels::{reduce, rng};
use memc::ir::{BinaryFn, CeParams, DType, Graph, Op, Origin, Phase, Span, TensorType, UnaryFn};
use memc::plan::{build, verify, BuildOptions};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

pub const SIM_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels/sim");
pub const ALIGN: u64 = 256;
/// The byte the shim's arenas start filled with outside initialized tensors.
pub const POISON: u8 = 0xff;
/// The 1-based training step passed to every launch (exercises SGD momentum and AdamW bias
/// correction past the first step in the op cases).
pub const CASE_STEP: u64 = 3;

/// Why the shim cannot run here, if it cannot.
pub fn gxx_missing() -> Option<String> {
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
pub fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
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

/// Compiles `kernel` with its launcher into an executable in `dir` (an empty path for a
/// kernel of library calls alone, which [`launch`] never executes).
pub fn compile(kernel: &Kernel, dir: &Path) -> Result<PathBuf, String> {
    if !kernel.has_code() {
        return Ok(PathBuf::new());
    }
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

/// Runs `kernel` over the arena file with the given values for its params: its launch and,
/// for a two-stage kernel, its finishing launch ([`KernelParam::Phase`] 0, then 1); for a
/// kernel that calls libraries, its calls in order, each GEMM through the host reference of
/// the same descriptor ([`Gemm::reference`](memc::codegen::gemm::Gemm::reference)).
/// `reverse` runs blocks and threads in reverse order (see `cuda_sim.h`).
pub fn launch(
    exe: &Path,
    kernel: &Kernel,
    arena: &Path,
    reverse: bool,
    value: impl Fn(KernelParam) -> u64,
) -> Result<(), String> {
    use memc::codegen::gemm::{Addr, Call};
    if kernel.library.is_empty() {
        let grids = [Some(kernel.grid), kernel.finish];
        for (phase, grid) in grids.into_iter().enumerate() {
            if let Some(grid) = grid {
                run_exe(exe, kernel, arena, reverse, (grid, phase as u64, 0), &value)?;
            }
        }
        return Ok(());
    }
    for call in &kernel.library {
        match call {
            Call::Gemm(g) => {
                let mut bytes = std::fs::read(arena).map_err(|e| e.to_string())?;
                g.reference(&mut bytes, |a| match a {
                    Addr::Input(i, plus) => value(KernelParam::Input(i)) + plus,
                    Addr::Output(plus) => value(KernelParam::Output) + plus,
                    Addr::Workspace(plus) => value(KernelParam::Workspace) + plus,
                })
                .map_err(|e| format!("{}: {e}", kernel.name))?;
                std::fs::write(arena, bytes).map_err(|e| e.to_string())?;
            }
            Call::Launch {
                grid, phase, chunk, ..
            } => run_exe(exe, kernel, arena, reverse, (*grid, *phase, *chunk), &value)?,
        }
    }
    Ok(())
}

/// One launch of `kernel`'s executable over `grid` with the given phase and chunk.
fn run_exe(
    exe: &Path,
    kernel: &Kernel,
    arena: &Path,
    reverse: bool,
    (grid, phase, chunk): ([u32; 3], u64, u64),
    value: &impl Fn(KernelParam) -> u64,
) -> Result<(), String> {
    let geometry = grid.iter().chain(&kernel.block).map(u32::to_string);
    let args = kernel.params[1..].iter().map(|&p| match p {
        KernelParam::Phase => phase.to_string(),
        KernelParam::Chunk => chunk.to_string(),
        p => value(p).to_string(),
    });
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
    if !out.status.success() {
        return Err(format!(
            "{} (phase {phase}, chunk {chunk}) exited with {}: {}",
            kernel.name,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// Writes `kernel`'s tensor table (if it reads one) at byte `workspace` of `arena`, with op
/// input `i` at arena byte `offset(i)`, as the CUDA executor does before a launch.
pub fn put_table(arena: &mut [u8], kernel: &Kernel, workspace: u64, offset: impl Fn(usize) -> u64) {
    if let Some(table) = &kernel.table {
        let bytes = table.bytes(offset);
        let at = workspace as usize;
        arena[at..at + bytes.len()].copy_from_slice(&bytes);
    }
}

pub fn round_to(dtype: DType, v: f32) -> f32 {
    match dtype {
        DType::F16 => f16::from_f32(v).to_f32(),
        DType::BF16 => bf16::from_f32(v).to_f32(),
        _ => v,
    }
}

/// Stores `values` (ids and bytes as their integer values) at byte `off` as `dtype`.
pub fn put(arena: &mut [u8], off: u64, dtype: DType, values: &[f32]) {
    let size = dtype.size() as usize;
    for (i, &v) in values.iter().enumerate() {
        let at = off as usize + i * size;
        let dst = &mut arena[at..at + size];
        match dtype {
            DType::F32 => dst.copy_from_slice(&v.to_le_bytes()),
            DType::F16 => dst.copy_from_slice(&f16::from_f32(v).to_le_bytes()),
            DType::BF16 => dst.copy_from_slice(&bf16::from_f32(v).to_le_bytes()),
            DType::I32 => dst.copy_from_slice(&(v as i32).to_le_bytes()),
            DType::U8 => dst[0] = v as u8,
        }
    }
}

/// Reads `n` elements of `dtype` at byte `off` as f32.
pub fn get(arena: &[u8], off: u64, dtype: DType, n: usize) -> Vec<f32> {
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
                DType::U8 => f32::from(b[0]),
            }
        })
        .collect()
}

/// Whether `op` is an attention op reading a key mask (its one integer input).
fn reads_key_mask(op: &Op) -> bool {
    matches!(
        op,
        Op::Attention(a)
            | Op::AttentionBackward { attn: a, .. }
            | Op::PackedAttention(a)
            | Op::PackedAttentionBackward(a)
            if a.key_mask
    )
}

/// A key mask `[b, t_k]` of 0/1 by batch item, in threes: padding from key `4 t_k / 5` on
/// (at 80 keys a whole key tile of 64 from a tile boundary), padding in the first three keys
/// and at every seventh (a causal query among the first sees only padding), all padding.
pub fn key_mask(shape: &[usize]) -> Vec<f32> {
    let tk = shape.get(1).copied().unwrap_or(1).max(1);
    (0..shape.iter().product::<usize>())
        .map(|i| {
            let (b, j) = (i / tk, i % tk);
            let padding = match b % 3 {
                0 => j >= tk * 4 / 5,
                1 => j < 3 || j % 7 == 6,
                _ => true,
            };
            if padding {
                0.0
            } else {
                1.0
            }
        })
        .collect()
}

/// Which rows a cross-entropy op takes.
fn ce_of(op: &Op) -> Option<CeParams> {
    match op {
        Op::CrossEntropy(ce) | Op::CrossEntropyBackward(ce) | Op::KeptCount(ce) => Some(*ce),
        Op::LinearCrossEntropy(lce) | Op::LinearCrossEntropyBackward { lce, .. } => Some(lce.ce),
        _ => None,
    }
}

/// Seeded input data for `op` at the given (possibly 16-bit) input types, exactly
/// representable in them: ids below the op's limit (every third the id a cross-entropy
/// ignores, if any), an attention's key mask as [`key_mask`] lays it out, floats standard normal except where the op needs otherwise (positive
/// second moments and divisors, y = max_to(x), the fused loss head's row losses from its
/// forward, a cross-entropy's count of kept rows, u8 codes uniform over 0..=255).
pub fn case_data(op: &Op, inputs: &[TensorType], seed: u64) -> Vec<Vec<f32>> {
    let mut data: Vec<Vec<f32>> = Vec::new();
    for (i, ty) in inputs.iter().enumerate() {
        let n = ty.numel() as usize;
        let key = seed.wrapping_mul(31).wrapping_add(i as u64);
        let values: Vec<f32> = if ty.dtype == DType::I32 && reads_key_mask(op) {
            key_mask(&ty.shape)
        } else if ty.dtype == DType::U8 {
            (0..n)
                .map(|j| (rng::uniform01(key, 0, j as u64) * 256.0).floor())
                .collect()
        } else if ty.dtype == DType::I32 {
            let limit = match op {
                Op::Embedding { .. } => inputs[0].shape[0],
                Op::EmbeddingBackward { rows, .. } => *rows,
                Op::LinearCrossEntropy(lce) | Op::LinearCrossEntropyBackward { lce, .. } => {
                    inputs[1].shape[usize::from(!lce.transposed)]
                }
                _ => inputs[0].shape.last().copied().unwrap_or(1),
            };
            let ignored = ce_of(op).and_then(|ce| ce.ignore_index);
            (0..n)
                .map(|j| match ignored {
                    Some(k) if j % 3 == 1 => k as f32,
                    _ => (rng::uniform01(key, 0, j as u64) * limit as f32).floor(),
                })
                .collect()
        } else if let (Op::CrossEntropy(ce), 2) | (Op::CrossEntropyBackward(ce), 3) = (op, i) {
            // The count of kept rows.
            let kept = data[1].iter().filter(|&&t| ce.keeps(t as i32)).count();
            vec![kept.max(1) as f32]
        } else if let (Op::MaxToBackward, 1) = (op, i) {
            let mut y = vec![0.0; n];
            reduce::max_to(&data[0], &inputs[0].shape, &mut y, &ty.shape);
            y
        } else if let (Op::LinearCrossEntropyBackward { lce, .. }, 3) = (op, i) {
            // The forward's row losses, so that the recovered log-sum-exp is the rows' own.
            let f32s: Vec<TensorType> = inputs[..3]
                .iter()
                .map(|t| match t.dtype {
                    DType::I32 => t.clone(),
                    _ => t.with_dtype(DType::F32),
                })
                .collect();
            let forward = Op::LinearCrossEntropy(*lce);
            let rows = cpu_reference(&forward, &f32s, &data, 1).output;
            rows.expect("the forward has an output")
        } else if selects(op) {
            // Halves, exact in every dtype, so operands tie with each other and with the
            // clamp bounds; `where`'s condition a 0/1 mask.
            (0..n)
                .map(|j| {
                    let v = (rng::normal01(key, 0, j as u64) * 2.0).round() * 0.5;
                    match (op, i) {
                        (Op::Where, 0) => f32::from(u8::from(v > 0.0)),
                        (Op::Unary(_) | Op::UnaryBackward(_), 0) if v == 0.0 => 0.5,
                        _ => v,
                    }
                })
                .collect()
        } else {
            let positive = matches!(
                (op, i),
                (Op::AdamW(_), 3..=5)
                    | (Op::Sgd(_), 3)
                    | (Op::Binary(_), 1)
                    | (Op::Binary(BinaryFn::Pow), 0)
            ) || (matches!(op, Op::AdamWGroup { .. }) && i % 4 == 3);
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

/// Whether `op` selects or compares (its data is drawn in halves to produce ties):
/// extrema, comparisons, `where`, `clamp` and `reciprocal`.
fn selects(op: &Op) -> bool {
    match op {
        Op::Binary(f) => f.is_comparison() || matches!(f, BinaryFn::Minimum | BinaryFn::Maximum),
        Op::Unary(f) | Op::UnaryBackward(f) => *f == UnaryFn::Reciprocal,
        Op::Where | Op::Clamp(_) | Op::ClampBackward(_) => true,
        _ => false,
    }
}

/// What a step produced: its output (if it has one) and its in-place updated inputs.
#[derive(Debug)]
pub struct Results {
    pub output: Option<Vec<f32>>,
    pub updated: Vec<(usize, Vec<f32>)>,
}

impl Results {
    /// Every value's bits, in order.
    pub fn bits(&self) -> Vec<u32> {
        let updated = self.updated.iter().flat_map(|(_, v)| v);
        self.output
            .iter()
            .flatten()
            .chain(updated)
            .map(|v| v.to_bits())
            .collect()
    }
}

pub fn origin(phase: Phase) -> Origin {
    Origin {
        span: Span { start: 0, end: 0 },
        scope: String::new(),
        phase,
    }
}

/// The CPU backend on a one-step plan of `op` over f32/i32 `inputs` holding `data`.
pub fn cpu_reference(op: &Op, inputs: &[TensorType], data: &[Vec<f32>], step: u64) -> Results {
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
        pipeline: None,
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
    // The CPU backend holds ids as their i32 bit patterns; `get` decodes them as values.
    let ids = g.node(v).ty.dtype == DType::I32;
    let decode = |out: std::borrow::Cow<'_, [f32]>| -> Vec<f32> {
        if ids {
            out.iter().map(|x| x.to_bits() as i32 as f32).collect()
        } else {
            out.into_owned()
        }
    };
    Results {
        output: ex.output("out").map(decode),
        updated: op
            .mutated_inputs()
            .iter()
            .map(|&i| (i, ex.read(buffer(i)).to_vec()))
            .collect(),
    }
}

/// The kernel of `op` over `inputs` run through the shim on an arena holding `data`, with
/// `workspace` bytes of scratch after the output (POISON on entry, as a reused arena's).
#[allow(clippy::too_many_arguments)]
pub fn shim_run(
    exe: &Path,
    kernel: &Kernel,
    (inputs, output): (&[TensorType], &TensorType),
    data: &[Vec<f32>],
    mutated: &[usize],
    arena_file: &Path,
    reverse: bool,
    workspace: u64,
) -> Result<Results, String> {
    // Each tensor (and the workspace) is followed by at least one guard block; the arena
    // starts as POISON bytes (NaN in every float type), so an unwritten output element fails
    // the comparison and a write outside a tensor shows in the guards.
    let scratch = TensorType::new(DType::F32, vec![workspace.div_ceil(4) as usize]);
    let mut offsets = Vec::new();
    let mut end = 0u64;
    for t in inputs.iter().chain([output, &scratch]) {
        offsets.push(end);
        end += (t.bytes().div_ceil(ALIGN) + 1) * ALIGN;
    }
    let mut arena = vec![POISON; end as usize];
    for (i, values) in data.iter().enumerate() {
        put(&mut arena, offsets[i], inputs[i].dtype, values);
    }
    put_table(&mut arena, kernel, offsets[inputs.len() + 1], |i| {
        offsets[i]
    });
    std::fs::write(arena_file, &arena).map_err(|e| e.to_string())?;
    launch(exe, kernel, arena_file, reverse, |p| match p {
        KernelParam::Arena => 0,
        KernelParam::Input(i) => offsets[i],
        KernelParam::Output => offsets[inputs.len()],
        KernelParam::Step | KernelParam::Stream => CASE_STEP,
        // The CPU reference runs one micro-step: the first.
        KernelParam::MicroStep => 0,
        KernelParam::Workspace => offsets[inputs.len() + 1],
        KernelParam::Phase | KernelParam::Chunk => 0,
    })?;
    let after = std::fs::read(arena_file).map_err(|e| e.to_string())?;
    let types = inputs.iter().chain([output, &scratch]);
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
pub fn rtol(dtype: DType) -> f32 {
    match dtype {
        DType::F16 => 2f32.powi(-9),
        DType::BF16 => 2f32.powi(-6),
        _ => 1e-4,
    }
}

/// Largest |got - want| over the tensor, and the largest ratio of error to allowed error
/// (the tensor passes when that ratio is at most 1).
pub fn compare(got: &[f32], want: &[f32], dtype: DType) -> (f32, f32) {
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
