//! NVRTC compilation of generated kernels (through cudarc, loading libnvrtc at run time) and
//! an optional ptxas assembly check.

use crate::codegen::build::GENERATED;
use crate::codegen::{CodegenError, Kernel};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Whether the NVRTC shared library can be loaded (on `LD_LIBRARY_PATH` or the system path).
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to open the library with libloading; no symbol is called.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

fn static_arch(arch: &str) -> Result<&'static str, CodegenError> {
    match arch {
        "compute_80" => Ok("compute_80"),
        "compute_90" => Ok("compute_90"),
        other => Err(CodegenError::Arch(other.to_string())),
    }
}

/// Compiles `kernel` to PTX for `arch` ("compute_80" or "compute_90") with C++17 and the
/// include directory of `cuda_fp16.h` / `cuda_bf16.h` taken from `MEMC_CUDA_INCLUDE`.
/// Returns the PTX text, `NvrtcMissing` when libnvrtc cannot be loaded (never panics for
/// that), or `Compile` with NVRTC's log.
pub fn compile_ptx(kernel: &Kernel, arch: &str) -> Result<String, CodegenError> {
    let arch = static_arch(arch)?;
    if !nvrtc_available() {
        return Err(CodegenError::NvrtcMissing);
    }
    if kernel.source.contains('\0') {
        return Err(CodegenError::Compile {
            name: kernel.name.clone(),
            log: "source contains a NUL byte".to_string(),
        });
    }
    let include_paths = std::env::var("MEMC_CUDA_INCLUDE")
        .map(|p| vec![p])
        .unwrap_or_default();
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        include_paths,
        options: vec!["--std=c++17".to_string()],
        name: Some(format!("{}.cu", kernel.name)),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(&kernel.source, opts)
        .map(|ptx| ptx.to_src())
        .map_err(|e| CodegenError::Compile {
            name: kernel.name.clone(),
            log: match e {
                cudarc::nvrtc::CompileError::CompileError { log, .. } => {
                    log.to_string_lossy().into_owned()
                }
                other => format!("{other:?}"),
            },
        })
}

/// The ptxas binary named by `MEMC_PTXAS`, if set.
pub fn ptxas_path() -> Option<PathBuf> {
    std::env::var_os("MEMC_PTXAS").map(PathBuf::from)
}

/// Assembles `ptx` with `ptxas -arch=<sm>` (e.g. "sm_90") into a throwaway cubin; returns
/// ptxas's diagnostics as the error when it fails or cannot run.
pub fn ptxas_check(
    ptxas: &Path,
    ptx: &str,
    sm: &str,
    work_dir: &Path,
    stem: &str,
) -> Result<(), String> {
    let file = work_dir.join(format!("{stem}.{sm}.ptx"));
    std::fs::write(&file, ptx).map_err(|e| format!("write {}: {e}", file.display()))?;
    let out = Command::new(ptxas)
        .arg(format!("-arch={sm}"))
        .arg(&file)
        .arg("-o")
        .arg("/dev/null")
        .output()
        .map_err(|e| format!("run {}: {e}", ptxas.display()))?;
    let _ = std::fs::remove_file(&file);
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Kernels per NVRTC program in [`check_all`]: enough to pay the headers' parse once for
/// many kernels, few enough that a failing batch is cheap to re-check kernel by kernel.
const BATCH: usize = 48;

/// Compiles `kernel` for compute_80 and compute_90 and, when `ptxas` is given, assembles each
/// PTX for sm_80 / sm_90; checks that every name in `entries` is in the PTX. Returns a
/// message per failure.
fn check_program(
    label: &str,
    kernel: &Kernel,
    entries: &[String],
    ptxas: Option<&Path>,
    scratch: &Path,
) -> Vec<String> {
    let mut errors = Vec::new();
    for (arch, sm) in [("compute_80", "sm_80"), ("compute_90", "sm_90")] {
        match compile_ptx(kernel, arch) {
            Err(e) => errors.push(format!("{label} ({}) {arch}: {e}", kernel.name)),
            Ok(ptx) => {
                if let Some(missing) = entries.iter().find(|e| !ptx.contains(e.as_str())) {
                    errors.push(format!(
                        "{label} ({}) {arch}: entry {missing} missing from PTX",
                        kernel.name
                    ));
                } else if let Some(p) = ptxas {
                    if let Err(e) = ptxas_check(p, &ptx, sm, scratch, &kernel.name) {
                        errors.push(format!("{label} ({}) ptxas {sm}: {e}", kernel.name));
                    }
                }
            }
        }
    }
    errors
}

/// One NVRTC program for kernels whose sources share everything before the generated
/// constants (the prelude and templates): the shared part once, then each kernel's constants
/// and entry in a namespace of its own, the entry renamed `<entry>_<i>`.
fn batch_program(kernels: &[&(String, Kernel)]) -> Option<(Kernel, Vec<String>)> {
    let (first, _) = kernels.first()?.1.source.split_once(GENERATED)?;
    let mut source = first.to_string();
    let mut entries = Vec::new();
    for (i, (_, k)) in kernels.iter().enumerate() {
        let (shared, own) = k.source.split_once(GENERATED)?;
        if shared != first {
            return None;
        }
        let entry = format!("{}_{i}", k.entry);
        let own = own.replacen(&format!(" {}(", k.entry), &format!(" {entry}("), 1);
        source.push_str(&format!("{GENERATED}namespace k{i} {{\n{own}}}\n"));
        entries.push(entry);
    }
    let name = format!("batch_{}_of_{}", kernels[0].1.name, kernels.len());
    let kernel = Kernel {
        name,
        source,
        entry: entries[0].clone(),
        ..kernels[0].1.clone()
    };
    Some((kernel, entries))
}

/// Checks `batch` as one program; when that fails, kernel by kernel. Returns how many
/// kernels passed and a message per failure.
fn check_batch(
    batch: &[&(String, Kernel)],
    ptxas: Option<&Path>,
    scratch: &Path,
) -> (usize, Vec<String>) {
    if let Some((program, entries)) = batch_program(batch) {
        if check_program(&batch[0].0, &program, &entries, ptxas, scratch).is_empty() {
            return (batch.len(), Vec::new());
        }
    }
    let mut passed = 0;
    let mut errors = Vec::new();
    for (label, k) in batch {
        let own = check_program(label, k, std::slice::from_ref(&k.entry), ptxas, scratch);
        passed += usize::from(own.is_empty());
        errors.extend(own);
    }
    (passed, errors)
}

/// Compiles every kernel for compute_80 and compute_90 and, when ptxas is known, assembles
/// each PTX for sm_80 / sm_90, on up to four threads. Kernels sharing their templates are
/// compiled together, up to [`BATCH`] per program (each in a namespace of its own, so the
/// code checked is each kernel's own); a program that fails is re-checked kernel by kernel
/// so each failure names its kernel. Returns how many kernels passed every check and a
/// message per failure (label, kernel name, stage).
pub fn check_all(kernels: &[(String, Kernel)], scratch: &std::path::Path) -> (usize, Vec<String>) {
    let ptxas = ptxas_path();
    let mut groups: std::collections::BTreeMap<&str, Vec<&(String, Kernel)>> =
        std::collections::BTreeMap::new();
    for k in kernels {
        let shared = k.1.source.split_once(GENERATED).map_or("", |(s, _)| s);
        groups.entry(shared).or_default().push(k);
    }
    let batches: Vec<&[&(String, Kernel)]> =
        groups.values().flat_map(|g| g.chunks(BATCH)).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new((0usize, Vec::new()));
    let workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(4);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                while let Some(batch) =
                    batches.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                {
                    let (passed, errors) = check_batch(batch, ptxas.as_deref(), scratch);
                    if let Ok(mut r) = results.lock() {
                        r.0 += passed;
                        r.1.extend(errors);
                    }
                }
            });
        }
    });
    results.into_inner().unwrap_or_default()
}
