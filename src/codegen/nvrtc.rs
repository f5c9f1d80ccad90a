//! NVRTC compilation of generated kernels (through cudarc, loading libnvrtc at run time):
//! PTX for a virtual architecture, or a CUBIN for the device's own with ptxas's resource
//! figures; the CUDA headers found without configuration; a check that builds many kernels
//! to CUBINs for sm_80 and sm_90 and fails any that spill.

use crate::codegen::build::GENERATED;
use crate::codegen::{CodegenError, Kernel};
use std::path::PathBuf;

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

/// Kernels per NVRTC program in [`check_all`]: enough to pay the headers' parse once for
/// many kernels, few enough that a failing batch is cheap to re-check kernel by kernel.
const BATCH: usize = 48;

/// An A100's and an H100's real architectures, the ones memc's kernels target.
pub const TARGET_SMS: [(u32, u32); 2] = [(8, 0), (9, 0)];

/// The functions ptxas's `-v` report (`log`) says spill, with the bytes each stores and
/// reloads, in the report's order.
pub fn spills(log: &str) -> Vec<(String, u64)> {
    let mut function = String::new();
    let mut out = Vec::new();
    for line in log.lines() {
        if let Some((_, rest)) = line.split_once("Function properties for ") {
            function = rest.trim().to_string();
        }
        let figure = |unit: &[&str]| number_before(line, unit).unwrap_or(0);
        let bytes = figure(&["bytes", "spill", "stores"]) + figure(&["bytes", "spill", "loads"]);
        if bytes > 0 {
            out.push((function.clone(), bytes));
        }
    }
    out
}

/// What ptxas spilled in one function of a program [`check_all`] built: the entry's index
/// among the program's entries (`None` for a function that is not one of them), the
/// architecture and the bytes stored and reloaded.
type Spilled = (Option<usize>, String, u64);

/// Builds `kernel` to a CUBIN for each of `sms` and checks that every name in `entries` is
/// in the image. Returns a message per failure and what ptxas spilled.
fn check_program(
    (label, kernel): (&str, &Kernel),
    entries: &[String],
    sms: &[(u32, u32)],
) -> (Vec<String>, Vec<Spilled>) {
    let mut errors = Vec::new();
    let mut spilled = Vec::new();
    for &sm in sms {
        let arch = format!("sm_{}{}", sm.0, sm.1);
        match cubin_and_log(kernel, sm) {
            Err(e) => errors.push(format!("{label} ({}) {arch}: {e}", kernel.name)),
            Ok((image, log)) => {
                let has = |e: &String| image.windows(e.len()).any(|w| w == e.as_bytes());
                if let Some(missing) = entries.iter().find(|e| !has(e)) {
                    errors.push(format!(
                        "{label} ({}) {arch}: entry {missing} missing from the CUBIN",
                        kernel.name
                    ));
                }
                for (function, bytes) in spills(&log) {
                    let entry = entries.iter().position(|e| *e == function);
                    spilled.push((entry, arch.clone(), bytes));
                }
            }
        }
    }
    (errors, spilled)
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

/// A kernel ptxas spilled when [`check_all`] built it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spill {
    /// The label the kernel was given.
    pub label: String,
    /// The kernel's name.
    pub kernel: String,
    /// The architecture it spilled on ("sm_80", "sm_90").
    pub arch: String,
    /// Bytes stored and reloaded per thread.
    pub bytes: u64,
}

/// What [`check_all`] found.
#[derive(Debug, Default)]
pub struct Checked {
    /// Kernels that built for every architecture with every entry in the image.
    pub built: usize,
    /// A message per failure (label, kernel name, architecture, what failed).
    pub failures: Vec<String>,
    /// Each kernel and architecture ptxas spilled on.
    pub spills: Vec<Spill>,
}

/// Checks `batch` as one program; when that fails, or spills in a function that is none of
/// its entries, kernel by kernel.
fn check_batch(batch: &[&(String, Kernel)], sms: &[(u32, u32)]) -> Checked {
    let spill = |(label, k): &(String, Kernel), arch: String, bytes| Spill {
        label: label.clone(),
        kernel: k.name.clone(),
        arch,
        bytes,
    };
    if let Some((program, entries)) = batch_program(batch) {
        let (errors, spilled) = check_program((&batch[0].0, &program), &entries, sms);
        let placed: Option<Vec<Spill>> = (spilled.into_iter())
            .map(|(i, arch, bytes)| Some(spill(batch.get(i?)?, arch, bytes)))
            .collect();
        if let (true, Some(spills)) = (errors.is_empty(), placed) {
            return Checked {
                built: batch.len(),
                failures: errors,
                spills,
            };
        }
    }
    let mut checked = Checked::default();
    for k in batch {
        let entry = std::slice::from_ref(&k.1.entry);
        let (errors, spilled) = check_program((&k.0, &k.1), entry, sms);
        checked.built += usize::from(errors.is_empty());
        checked.failures.extend(errors);
        (checked.spills).extend(spilled.into_iter().map(|(_, arch, b)| spill(k, arch, b)));
    }
    checked
}

/// Builds every kernel to a CUBIN for each architecture of `sms` (e.g. [`TARGET_SMS`];
/// NVRTC running ptxas with `-v`), on up to four threads, and reports each that ptxas
/// spilled. Kernels sharing their templates
/// are compiled together, up to [`BATCH`] per program (each in a namespace of its own, so
/// the code checked is each kernel's own); a program that fails is re-checked kernel by
/// kernel so each failure names its kernel.
pub fn check_all(kernels: &[(String, Kernel)], sms: &[(u32, u32)]) -> Checked {
    let mut groups: std::collections::BTreeMap<&str, Vec<&(String, Kernel)>> =
        std::collections::BTreeMap::new();
    for k in kernels.iter().filter(|k| k.1.has_code()) {
        let shared = k.1.source.split_once(GENERATED).map_or("", |(s, _)| s);
        groups.entry(shared).or_default().push(k);
    }
    let batches: Vec<&[&(String, Kernel)]> =
        groups.values().flat_map(|g| g.chunks(BATCH)).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(Checked::default());
    let workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(4);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                while let Some(batch) =
                    batches.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                {
                    let found = check_batch(batch, sms);
                    if let Ok(mut r) = results.lock() {
                        r.built += found.built;
                        r.failures.extend(found.failures);
                        r.spills.extend(found.spills);
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
    let (image, log) = cubin_and_log(kernel, sm)?;
    Ok(Cubin {
        image,
        resources: parse_resources(&log),
    })
}

/// The CUBIN NVRTC builds from `kernel` for `sm`, and its log with ptxas's `-v` report.
fn cubin_and_log(kernel: &Kernel, sm: (u32, u32)) -> Result<(Vec<u8>, String), CodegenError> {
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
                image.map(|image| (image, log))
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
        assert_eq!(spills(log), vec![("k".to_string(), 20)]);
        let clean = log.replace("8 bytes spill stores, 12", "0 bytes spill stores, 0");
        assert!(spills(&clean).is_empty());
    }
}
