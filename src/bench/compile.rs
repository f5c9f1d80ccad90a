//! `memc bench compile`: wall time and peak resident memory of `memc compile` on the llama7b
//! example at growing depth (L = 8, 32, 128) and on the UNet example, each compile in its own
//! process, best of three runs.

use std::fmt::Write;
use std::io;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

/// The cases: example name and `--set` overrides.
const CASES: [(&str, Option<&str>); 4] = [
    ("llama7b", Some("L=8")),
    ("llama7b", Some("L=32")),
    ("llama7b", Some("L=128")),
    ("unet", None),
];

/// The table for the examples in `examples` that exist, compiled by the executable `memc`,
/// with the time ratio of llama7b at L=128 to L=32 (the growth with depth: 4 at linear cost).
/// Fails when a compile cannot start or fails.
pub fn compile_table(memc: &Path, examples: &Path) -> io::Result<String> {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<10} {:<8} {:>9} {:>14}",
        "model", "dims", "seconds", "peak RSS"
    );
    let mut llama = Vec::new();
    for (model, set) in CASES {
        let file = examples.join(format!("{model}.mdl"));
        if !file.exists() {
            continue;
        }
        let (seconds, rss) = (0..3)
            .map(|_| run(memc, &file, set))
            .collect::<io::Result<Vec<_>>>()?
            .into_iter()
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "{model:<10} {:<8} {seconds:>9.3} {:>10.1} MiB",
            set.unwrap_or("-"),
            rss as f64 / (1u64 << 20) as f64
        );
        if model == "llama7b" {
            llama.push(seconds);
        }
    }
    if let [_, at32, at128] = llama[..] {
        let _ = writeln!(
            out,
            "llama7b L=128 / L=32 time: {:.2}",
            at128 / at32.max(1e-9)
        );
    }
    Ok(out)
}

/// Seconds and peak resident bytes of `memc compile file [--set set]` in a child process.
fn run(memc: &Path, file: &Path, set: Option<&str>) -> io::Result<(f64, u64)> {
    let mut command = Command::new(memc);
    command
        .arg("compile")
        .arg(file)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(set) = set {
        command.arg("--set").arg(set);
    }
    let start = Instant::now();
    let child = command.spawn()?;
    let pid = libc::pid_t::try_from(child.id()).map_err(io::Error::other)?;
    let mut status = 0;
    // SAFETY: `rusage` is plain data, valid zeroed; wait4 writes it and `status` for the
    // child just spawned, which nothing else waits for.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let seconds = start.elapsed().as_secs_f64();
    if waited != pid {
        return Err(io::Error::last_os_error());
    }
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        return Err(io::Error::other(format!(
            "memc compile {} failed",
            file.display()
        )));
    }
    // Linux reports ru_maxrss in KiB.
    let rss = u64::try_from(usage.ru_maxrss).unwrap_or(0) * 1024;
    Ok((seconds, rss))
}
