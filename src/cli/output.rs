//! Writing results: stdout, or a file replaced atomically (temp file + rename).

use super::Failure;
use memc::passes::arena::{layout, LayoutOptions};
use memc::plan::Plan;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Writes `text` to `path` atomically, or to stdout.
pub fn write(path: Option<&Path>, text: &str) -> Result<(), Failure> {
    match path {
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())
                .map_err(|e| Failure::Plain(format!("cannot write to stdout: {e}")))
        }
        Some(p) => write_atomic(p, text.as_bytes()),
    }
}

/// Writes bytes to `path` through a temporary file in the same folder, then renames. The file
/// gets the mode a plain create would give it (0666 less the umask), not the temporary
/// file's private 0600.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), Failure> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let fail = |e: std::io::Error| Failure::Plain(format!("cannot write {}: {e}", path.display()));
    let mut builder = tempfile::Builder::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        // open(2) applies the umask to this mode, as it does for any new file.
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    let mut tmp = builder.tempfile_in(dir).map_err(fail)?;
    tmp.write_all(bytes).map_err(fail)?;
    tmp.persist(path).map_err(|e| fail(e.error))?;
    Ok(())
}

/// The plan (or its report, with each buffer's origin: name, class, bytes, role, `.mdl`
/// span and line, and the text of those lines) as pretty JSON.
pub fn json(plan: &Plan, whole: bool) -> Result<String, Failure> {
    let value = if whole {
        serde_json::to_value(plan)
    } else {
        let origins: Vec<serde_json::Value> = (plan.buffers.iter())
            .map(|b| {
                serde_json::json!({
                    "id": b.id, "name": b.name, "class": b.class, "bytes": b.bytes,
                    "role": b.role, "span": b.span, "line": b.line,
                })
            })
            .collect();
        serde_json::to_value(serde_json::json!({
            "model": plan.model,
            "report": plan.report,
            "buffers": origins,
            "source_lines": plan.source_lines,
        }))
    };
    value
        .and_then(|v| serde_json::to_string_pretty(&v))
        .map(|s| s + "\n")
        .map_err(|e| Failure::Internal(vec![format!("cannot serialize the plan: {e}")]))
}

/// `memc arena`: lays out a CSV instance and reports peak, bound, ratio and time.
pub fn arena(
    file: &Path,
    capacity: Option<u64>,
    secs: f64,
    output: Option<&Path>,
) -> Result<(), Failure> {
    let text = super::read_source(file)?;
    let name = file.display().to_string();
    let inst = memc::arena_csv::parse_instance(&name, &text)
        .map_err(|e| Failure::Plain(format!("{:?}", miette::Report::new(e))))?;
    let start = Instant::now();
    let opts = LayoutOptions {
        alignment: 1,
        time_limit: Duration::from_secs_f64(secs.max(0.0)),
        capacity,
    };
    let spinner = std::io::IsTerminal::is_terminal(&std::io::stderr()).then(|| {
        let s = indicatif::ProgressBar::new_spinner();
        s.set_message(format!("laying out {} buffers", inst.requests.len()));
        s.enable_steady_tick(Duration::from_millis(100));
        s
    });
    let l = layout(&inst.requests, &opts);
    if let Some(s) = spinner {
        s.finish_and_clear();
    }
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let ratio = if l.lower_bound > 0 {
        l.size as f64 / l.lower_bound as f64
    } else {
        1.0
    };
    eprintln!(
        "peak {} lower bound {} ratio {ratio:.4} time {ms:.1} ms{}",
        l.size,
        l.lower_bound,
        if l.optimal { " (optimal)" } else { "" }
    );
    if let Some(cap) = capacity.filter(|&c| l.size > c) {
        return Err(Failure::Plain(format!(
            "no layout within capacity {cap} found (best {}, lower bound {})",
            l.size, l.lower_bound
        )));
    }
    match output {
        Some(p) => write_atomic(
            p,
            memc::arena_csv::write_solution(&inst, &l.offsets).as_bytes(),
        ),
        None => Ok(()),
    }
}

/// Writes `value` as indented JSON to `path` (atomically).
fn write_pretty(path: &Path, value: &serde_json::Value) -> Result<(), Failure> {
    let text =
        serde_json::to_string_pretty(value).map_err(|e| Failure::Internal(vec![e.to_string()]))?;
    write_atomic(path, text.as_bytes())
}

/// `memc emit`: `<kernel>.cu`, and when NVRTC loads `<kernel>.ptx` (the virtual
/// architecture of `gpu`) and each kernel's resources from ptxas for `gpu`'s compute
/// capability (registers, shared memory, stack, spills); `plan.json`; `manifest.json`
/// mapping each kernel to its source, launches (a two-stage reduction's finishing grid),
/// resources, library calls (cuBLASLt GEMMs with their descriptors, and the kernel's own
/// launches between them; a step of library calls alone has no source) and steps, then
/// an offloaded plan's copies and host updates ([`off_device_entries`]); and, with NVRTC,
/// `device.json`: the device bytes beyond the arena that the compiled kernels fix (module
/// images, and local memory for their stack frames reserved for every resident thread).
/// NVRTC loading without the CUDA headers is a plain error naming them.
pub fn emit(compiled: &memc::Compiled, dir: &Path, gpu: memc::cost::Gpu) -> Result<(), Failure> {
    use memc::codegen::nvrtc::{compile_cubin, compile_ptx, nvrtc_available};
    use memc::codegen::CodegenError;
    let failed = |e: CodegenError| match e {
        CodegenError::NvrtcMissing | CodegenError::HeadersMissing => Failure::Plain(e.to_string()),
        other => Failure::Internal(vec![other.to_string()]),
    };
    let plan = compiled.plan.plan();
    memc::exec::cuda_can_run(plan, true).map_err(|e| Failure::Plain(e.to_string()))?;
    let uses = memc::codegen::plan_kernel_uses(plan)
        .map_err(|e| Failure::Internal(vec![format!("codegen: {e}")]))?;
    std::fs::create_dir_all(dir)
        .map_err(|e| Failure::Plain(format!("cannot create {}: {e}", dir.display())))?;
    let previous = previous_emit(dir);
    let with_ptx = nvrtc_available();
    let spec = gpu.spec();
    let sm = format!("sm_{}{}", spec.compute.0, spec.compute.1);
    let virtual_arch = if spec.compute.0 >= 9 {
        "compute_90"
    } else {
        "compute_80"
    };
    let (mut modules, mut stack) = (0u64, 0u64);
    let mut manifest = Vec::new();
    for (k, steps) in &uses {
        let library = (!k.library.is_empty()).then_some(&k.library);
        if !k.has_code() {
            manifest
                .push(serde_json::json!({ "kernel": k.name, "library": library, "steps": steps }));
            continue;
        }
        let cu = format!("{}.cu", k.name);
        write_atomic(&dir.join(&cu), k.source.as_bytes())?;
        let (ptx, resources) = if with_ptx {
            let text = compile_ptx(k, virtual_arch).map_err(failed)?;
            write_atomic(&dir.join(format!("{}.ptx", k.name)), text.as_bytes())?;
            let cubin = compile_cubin(k, spec.compute).map_err(failed)?;
            modules += cubin.image.len() as u64;
            stack = stack.max(cubin.resources.stack_bytes);
            (Some(format!("{}.ptx", k.name)), Some(cubin.resources))
        } else {
            (None, None)
        };
        manifest.push(serde_json::json!({ "kernel": k.name, "entry": k.entry, "source": cu, "ptx": ptx, "sm": sm, "resources": resources, "library": library, "grid": k.grid, "finish": k.finish, "block": k.block, "shared_bytes": k.shared_bytes, "steps": steps }));
    }
    manifest.extend(off_device_entries(plan));
    if with_ptx {
        let local = stack * u64::from(spec.threads_per_sm) * u64::from(spec.sms);
        let device = serde_json::json!({
            "gpu": gpu.name(), "sm": sm, "arena": plan.arena_bytes, "modules": modules,
            "local_per_thread": stack, "local": local,
            "total": plan.arena_bytes + modules + local,
            "not_included": "the CUDA context (measured by scripts/gpu-check)",
        });
        write_pretty(&dir.join("device.json"), &device)?;
        eprintln!(
            "device bytes on {}: arena {} + module images {} + local memory {} = {} (CUDA context not included)",
            gpu.name(),
            plan.arena_bytes,
            modules,
            local,
            plan.arena_bytes + modules + local
        );
    }
    write_atomic(&dir.join("plan.json"), json(plan, true)?.as_bytes())?;
    let written: Vec<String> = kernel_files(&manifest)
        .map(String::from)
        .chain(with_ptx.then(|| "device.json".to_string()))
        .collect();
    write_pretty(
        &dir.join("manifest.json"),
        &serde_json::Value::from(manifest),
    )?;
    for stale in previous.iter().filter(|f| !written.contains(f)) {
        std::fs::remove_file(dir.join(stale))
            .or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(e),
            })
            .map_err(|e| Failure::Plain(format!("cannot remove the stale {stale}: {e}")))?;
    }
    eprintln!(
        "wrote {} kernels for {} steps to {}{}",
        uses.len(),
        plan.steps.len(),
        dir.display(),
        if with_ptx {
            " (with PTX)"
        } else {
            " (no NVRTC: sources only; source scripts/cuda-env for PTX)"
        }
    );
    Ok(())
}

/// The manifest's entries for the steps that are not kernels, one per op in first-use order:
/// the copies between the device and the pinned host arena (`transfer`, with the bytes the
/// steps move) and the updates that run on the host (`host`).
fn off_device_entries(plan: &memc::plan::Plan) -> Vec<serde_json::Value> {
    use memc::plan::Placement;
    let mut entries: Vec<(Placement, &str, Vec<usize>, u64)> = Vec::new();
    for (s, step) in plan.steps.iter().enumerate() {
        let placement = plan.placement(step);
        if placement == Placement::Device {
            continue;
        }
        let name = step.op.name();
        let moved = match placement {
            Placement::Transfer => memc::plan::copy_order::copied_device_bytes(plan, step)
                .map_or(0, |r| r.end - r.start),
            _ => 0,
        };
        match entries.iter_mut().find(|(_, n, _, _)| *n == name) {
            Some((_, _, steps, bytes)) => {
                steps.push(s);
                *bytes += moved;
            }
            None => entries.push((placement, name, vec![s], moved)),
        }
    }
    (entries.into_iter())
        .map(|(placement, name, steps, bytes)| match placement {
            Placement::Transfer => {
                serde_json::json!({ "transfer": name, "bytes": bytes, "steps": steps })
            }
            _ => serde_json::json!({ "host": name, "steps": steps }),
        })
        .collect()
}

/// The files a previous `memc emit` into `dir` wrote besides plan.json and manifest.json:
/// the kernel sources and PTX its manifest lists, and device.json when the manifest exists.
/// Only plain file names count (a manifest naming a path elsewhere is ignored there).
fn previous_emit(dir: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(dir.join("manifest.json")) else {
        return Vec::new();
    };
    let Ok(serde_json::Value::Array(entries)) = serde_json::from_str(&text) else {
        return Vec::new();
    };
    kernel_files(&entries)
        .chain(["device.json"])
        .filter(|name| {
            let plain = Path::new(name).file_name().and_then(|f| f.to_str()) == Some(*name);
            plain && !name.starts_with('.')
        })
        .map(String::from)
        .collect()
}

/// The source and PTX file names a manifest's entries list.
fn kernel_files(entries: &[serde_json::Value]) -> impl Iterator<Item = &str> {
    entries
        .iter()
        .flat_map(|e| [&e["source"], &e["ptx"]])
        .filter_map(|v| v.as_str())
}

/// A spinner on stderr drawn with the indicatif `template`, when stderr is a terminal.
pub fn spinner(template: &str) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new_spinner();
    if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar.enable_steady_tick(std::time::Duration::from_millis(100));
    Some(bar)
}

/// `memc bench WHAT [DIR]`: the table of `what` (`checkpoint`, `compile` or `arena`) over
/// the models or MiniMalloc instances in `dir` (its default for each), printed.
pub fn bench(what: &str, dir: Option<PathBuf>, layout_time: f64) -> Result<(), Failure> {
    let table = if what == "checkpoint" {
        let dir = dir.unwrap_or_else(|| PathBuf::from("examples"));
        memc::bench::checkpoint_table(&dir)
            .map_err(|e| Failure::Plain(format!("cannot read {}: {e}", dir.display())))?
    } else if what == "compile" {
        let dir = dir.unwrap_or_else(|| PathBuf::from("examples"));
        let memc = std::env::current_exe()
            .map_err(|e| Failure::Plain(format!("cannot find memc itself: {e}")))?;
        memc::bench::compile_table(&memc, &dir)
            .map_err(|e| Failure::Plain(format!("bench compile: {e}")))?
    } else {
        let dir = dir.unwrap_or_else(|| PathBuf::from("../shared/benchmarks/minimalloc"));
        memc::arena_csv::run_benchmark(&dir, Duration::from_secs_f64(layout_time.max(0.0)))
            .map_err(|e| {
                Failure::Plain(format!(
                    "cannot read {}: {e} (give the folder of MiniMalloc CSV instances: memc bench arena DIR)",
                    dir.display()
                ))
            })?
    };
    write(None, &table)
}
