//! NVRTC compilation of generated kernels (through cudarc, loading libnvrtc at run time):
//! PTX for a virtual architecture, or a CUBIN for the device's own with ptxas's resource
//! figures; the CUDA headers found without configuration; an optional ptxas assembly check.

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

/// Headers the kernels include.
const HEADERS: [&str; 2] = ["cuda_fp16.h", "cuda_bf16.h"];

/// The directory holding `cuda_fp16.h` and `cuda_bf16.h`: `MEMC_CUDA_INCLUDE` when set;
/// else the first that has both among the include directories beside each
/// `LD_LIBRARY_PATH` entry (`<lib>/../include`; the PyPI wheels' `nvidia/cuda_nvrtc/lib`
/// next to `nvidia/cuda_runtime/include`), `$CUDA_HOME/include`, `$CUDA_PATH/include`,
/// `/usr/local/cuda/include` and `/usr/include`. None when no candidate has them.
pub fn cuda_include_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("MEMC_CUDA_INCLUDE") {
        return Some(PathBuf::from(dir));
    }
    let mut candidates: Vec<PathBuf> = Vec::new();
    for lib in std::env::var_os("LD_LIBRARY_PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
    {
        candidates.push(lib.join("../include"));
        candidates.push(lib.join("../../cuda_runtime/include"));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = std::env::var_os(var) {
            candidates.push(PathBuf::from(root).join("include"));
        }
    }
    candidates.push(PathBuf::from("/usr/local/cuda/include"));
    candidates.push(PathBuf::from("/usr/include"));
    candidates
        .into_iter()
        .find(|dir| HEADERS.iter().all(|h| dir.join(h).is_file()))
}

/// The checks every compilation starts with: NVRTC loads, the headers are found and the
/// source has no NUL byte. Returns the include directory.
fn ready(kernel: &Kernel) -> Result<PathBuf, CodegenError> {
    if !nvrtc_available() {
        return Err(CodegenError::NvrtcMissing);
    }
    let include = cuda_include_dir().ok_or(CodegenError::HeadersMissing)?;
    if kernel.source.contains('\0') {
        return Err(CodegenError::Compile {
            name: kernel.name.clone(),
            log: "source contains a NUL byte".to_string(),
        });
    }
    Ok(include)
}

/// Compiles `kernel` to PTX for `arch` ("compute_80" or "compute_90") with C++17 and the
/// headers of [`cuda_include_dir`]. Returns the PTX text, `NvrtcMissing` when libnvrtc
/// cannot be loaded or `HeadersMissing` when the headers cannot be found (never panics for
/// either), or `Compile` with NVRTC's log.
pub fn compile_ptx(kernel: &Kernel, arch: &str) -> Result<String, CodegenError> {
    let arch = static_arch(arch)?;
    let include = ready(kernel)?;
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        include_paths: vec![include.to_string_lossy().into_owned()],
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
    for k in kernels.iter().filter(|k| k.1.has_code()) {
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

/// ptxas's resource figures for one kernel image (`-v`): what each thread and block uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Resources {
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory per block, bytes.
    pub shared_bytes: u64,
    /// Stack frame per thread (local memory), bytes.
    pub stack_bytes: u64,
    /// Bytes spilled to local memory per thread (stores).
    pub spill_store_bytes: u64,
    /// Bytes reloaded from spills per thread.
    pub spill_load_bytes: u64,
}

/// The number right before the words `unit` in `line` (`"Used 32 registers"` -> 32 for
/// `["registers"]`).
fn number_before(line: &str, unit: &[&str]) -> Option<u64> {
    let words: Vec<&str> = line.split([' ', ',']).filter(|w| !w.is_empty()).collect();
    words
        .windows(unit.len() + 1)
        .find(|w| w[1..] == *unit)
        .and_then(|w| w[0].parse().ok())
}

/// Reads ptxas's `-v` report (as NVRTC's log carries it) for one entry: registers, shared
/// memory, stack frame and spill bytes. Lines it does not know are ignored; absent figures
/// are zero.
pub fn parse_resources(log: &str) -> Resources {
    let mut r = Resources::default();
    for line in log.lines() {
        let figure = |unit: &[&str]| number_before(line, unit);
        if let Some(n) = figure(&["registers"]) {
            r.registers = u32::try_from(n).unwrap_or(u32::MAX);
            r.shared_bytes = figure(&["bytes", "smem"]).unwrap_or(0);
        }
        if let Some(n) = figure(&["bytes", "stack", "frame"]) {
            r.stack_bytes = n;
            r.spill_store_bytes = figure(&["bytes", "spill", "stores"]).unwrap_or(0);
            r.spill_load_bytes = figure(&["bytes", "spill", "loads"]).unwrap_or(0);
        }
    }
    r
}

/// A kernel compiled for one real architecture: the image the driver loads without
/// JIT-compiling, and ptxas's figures for it.
#[derive(Debug, Clone)]
pub struct Cubin {
    /// The CUBIN bytes.
    pub image: Vec<u8>,
    /// Registers, shared memory, stack and spills.
    pub resources: Resources,
}

/// Compiles `kernel` to a CUBIN for compute capability `sm` (e.g. (9, 0) -> `sm_90`) with
/// ptxas's `-v` report parsed into [`Resources`]. Errors as [`compile_ptx`]; an
/// architecture this NVRTC does not know is a `Compile` error (callers fall back to PTX).
pub fn compile_cubin(kernel: &Kernel, sm: (u32, u32)) -> Result<Cubin, CodegenError> {
    use cudarc::nvrtc::{result, sys};
    use std::ffi::CString;
    let include = ready(kernel)?;
    let failed = |log: String| CodegenError::Compile {
        name: kernel.name.clone(),
        log,
    };
    let src = CString::new(kernel.source.as_bytes()).map_err(|e| failed(e.to_string()))?;
    let name = CString::new(format!("{}.cu", kernel.name)).map_err(|e| failed(e.to_string()))?;
    let options = [
        format!("--gpu-architecture=sm_{}{}", sm.0, sm.1),
        "--std=c++17".to_string(),
        format!("--include-path={}", include.to_string_lossy()),
        "--ptxas-options=-v".to_string(),
    ];
    let prog = result::create_program(&src, Some(&name)).map_err(|e| failed(format!("{e:?}")))?;
    // SAFETY: `prog` was created above from `src` and `name`, which outlive it, and is
    // destroyed once below; the CUBIN buffer has the size NVRTC reports.
    let outcome = unsafe {
        let compiled = result::compile_program(prog, &options);
        let log = result::get_program_log(prog)
            .map(|l| {
                let bytes: Vec<u8> = l
                    .iter()
                    .take_while(|&&c| c != 0)
                    .map(|&c| c as u8)
                    .collect();
                String::from_utf8_lossy(&bytes).into_owned()
            })
            .unwrap_or_default();
        match compiled {
            Err(e) => Err(failed(format!("{e:?}: {log}"))),
            Ok(()) => {
                let mut size = 0usize;
                let image = match sys::nvrtcGetCUBINSize(prog, &mut size).result() {
                    Ok(()) => {
                        let mut image = vec![0u8; size];
                        sys::nvrtcGetCUBIN(prog, image.as_mut_ptr().cast())
                            .result()
                            .map(|()| image)
                            .map_err(|e| failed(format!("{e:?}")))
                    }
                    Err(e) => Err(failed(format!("{e:?}"))),
                };
                image.map(|image| Cubin {
                    image,
                    resources: parse_resources(&log),
                })
            }
        }
    };
    // SAFETY: created above, not destroyed before.
    let _ = unsafe { result::destroy_program(prog) };
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptxas_report_is_read() {
        let log = "ptxas info    : Compiling entry function 'k' for 'sm_90'\n\
                   ptxas info    : Function properties for k\n    \
                   16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n\
                   ptxas info    : Used 40 registers, 4096 bytes smem, 368 bytes cmem[0]\n";
        assert_eq!(
            parse_resources(log),
            Resources {
                registers: 40,
                shared_bytes: 4096,
                stack_bytes: 16,
                spill_store_bytes: 8,
                spill_load_bytes: 12,
            }
        );
        assert_eq!(parse_resources("no report"), Resources::default());
    }
}
