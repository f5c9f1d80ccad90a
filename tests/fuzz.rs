//! Deterministic mutation fuzzing of the example models through the library: truncations,
//! deleted lines, flipped bytes and swapped tokens must never panic, and every user error
//! must carry a help line and a span inside the source. Dims are overridden to small values
//! so each compile is fast; a mutant that lost a dim fails on the override, which is fine.
#![allow(clippy::panic)]

use memc::{compile, CompileError, Options};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::Duration;

/// Small xorshift64 generator: the same mutants on every run.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Dims of the transformer examples: llama's, of which gpt2 has all but the last (`F`).
const TRANSFORMER: [(&str, i64); 7] = [
    ("L", 1),
    ("T", 16),
    ("D", 64),
    ("H", 4),
    ("V", 128),
    ("B", 2),
    ("F", 96),
];

fn overrides(example: &str) -> Vec<(String, i64)> {
    let set: &[(&str, i64)] = match example {
        "gpt2.mdl" => &TRANSFORMER[..6],
        "llama7b.mdl" => &TRANSFORMER,
        // Batch norms that train need more than one value per channel: B = 2 where the
        // deepest feature map is one pixel.
        "resnet18.mdl" => &[("B", 2), ("S", 32), ("K", 10)],
        "unet.mdl" => &[("B", 1), ("S", 16)],
        "sd_unet.mdl" => &[("B", 1), ("S", 16), ("M", 64), ("L", 4)],
        "unet3d.mdl" => &[("B", 2), ("S", 8), ("F", 4)],
        "unet3d_tileable.mdl" => &[("B", 1), ("S", 8), ("F", 4)],
        "mlp.mdl" => &[("B", 2), ("IN", 16), ("H", 8)],
        _ => &[],
    };
    set.iter().map(|&(k, v)| (k.to_string(), v)).collect()
}

/// Byte ranges of the source's tokens: identifiers/numbers, or single punctuation chars.
fn tokens(src: &str) -> Vec<(usize, usize)> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c.is_ascii_alphanumeric() || c == b'_' || c == b'.' {
            let s = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'.') {
                i += 1;
            }
            out.push((s, i));
        } else {
            out.push((i, i + 1));
            i += 1;
        }
    }
    out
}

/// `MEMC_FUZZ_SCALE=N` multiplies the random flips and swaps (default 1) for longer hunts.
fn scale() -> usize {
    std::env::var("MEMC_FUZZ_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
        .max(1)
}

fn mutants(src: &str, seed: u64) -> Vec<(String, String)> {
    let mut rng = Rng::new(seed);
    let scale = scale();
    let mut out = Vec::new();
    let len = src.len();
    // Truncations at 40 spread positions (plus jitter), always on a char boundary.
    for i in 0..40 {
        let mut at = (len * i / 40 + rng.below(len / 40 + 1)).min(len);
        while !src.is_char_boundary(at) {
            at -= 1;
        }
        out.push((format!("truncate at {at}"), src[..at].to_string()));
    }
    // Deleting one line, for 30 lines spread over the file.
    let lines: Vec<&str> = src.lines().collect();
    let picks = lines.len().min(30);
    for i in 0..picks {
        let drop = i * lines.len() / picks;
        let text: Vec<&str> = lines
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != drop)
            .map(|(_, l)| *l)
            .collect();
        out.push((format!("delete line {}", drop + 1), text.join("\n")));
    }
    // 60 (times the scale) single-byte flips to another ASCII byte (control characters included).
    let bytes = src.as_bytes();
    for _ in 0..60 * scale {
        let at = rng.below(len);
        if !bytes[at].is_ascii() {
            continue;
        }
        let mut m = bytes.to_vec();
        m[at] = (rng.below(127) + 1) as u8;
        let text = String::from_utf8_lossy(&m).into_owned();
        out.push((
            format!("byte {at}: {:?} -> {:?}", bytes[at] as char, m[at] as char),
            text,
        ));
    }
    // 30 (times the scale) swaps of two tokens: half adjacent, half anywhere.
    let toks = tokens(src);
    for k in 0..30 * scale {
        if toks.len() < 2 {
            break;
        }
        let a = rng.below(toks.len() - 1);
        let b = if k % 2 == 0 {
            a + 1
        } else {
            a + 1 + rng.below(toks.len() - a - 1)
        };
        let ((s1, e1), (s2, e2)) = (toks[a], toks[b]);
        let text = format!(
            "{}{}{}{}{}",
            &src[..s1],
            &src[s2..e2],
            &src[e1..s2],
            &src[s1..e1],
            &src[e2..]
        );
        out.push((
            format!("swap `{}` and `{}`", &src[s1..e1], &src[s2..e2]),
            text,
        ));
    }
    out
}

/// What compiling one mutant gave.
enum Outcome {
    Compiled,
    Rejected,
    /// A panic, an internal error, or a user error without help or with a bad span.
    Failed(String),
}

/// Compiles one mutant and checks what came back.
fn check(src: &str, options: &Options) -> Outcome {
    let result = catch_unwind(AssertUnwindSafe(|| match compile(src, options) {
        Ok(_) => Outcome::Compiled,
        Err(CompileError::Internal(errs)) => {
            Outcome::Failed(format!("internal error: {}", errs.join("; ")))
        }
        Err(CompileError::User(e)) => {
            if e.help.trim().is_empty() {
                return Outcome::Failed(format!("user error without help: {}", e.message));
            }
            if e.message.trim().is_empty() {
                return Outcome::Failed("user error without a message".to_string());
            }
            if let Some(s) = e.span {
                if s.start > s.end || s.end > src.len() {
                    return Outcome::Failed(format!(
                        "span {}..{} outside the {}-byte source: {}",
                        s.start,
                        s.end,
                        src.len(),
                        e.message
                    ));
                }
            }
            // Rendering must not panic either.
            let _ = format!("{:?}", miette::Report::new(e.with_source("fuzz.mdl", src)));
            Outcome::Rejected
        }
    }));
    result.unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Outcome::Failed(format!("panic: {msg}"))
    })
}

#[test]
fn mutated_examples_never_panic() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.ends_with(".mdl"))
        .collect();
    names.sort();
    assert!(
        names.len() >= 5,
        "expected the five examples, found {names:?}"
    );
    let mut failures = Vec::new();
    let (mut total, mut compiled, mut rejected) = (0, 0, 0);
    for (seed, name) in names.iter().enumerate() {
        let src = std::fs::read_to_string(dir.join(name))
            .unwrap_or_else(|e| panic!("cannot read {name}: {e}"));
        let options = Options {
            overrides: overrides(name),
            layout_time: Duration::ZERO,
            ..Options::default()
        };
        // The unmutated example must compile with these overrides.
        match check(&src, &options) {
            Outcome::Compiled => {}
            Outcome::Rejected => failures.push(format!(
                "{name} (unmutated) is rejected with its small dims"
            )),
            Outcome::Failed(f) => failures.push(format!("{name} (unmutated): {f}")),
        }
        for (what, text) in mutants(&src, seed as u64 + 1) {
            total += 1;
            match check(&text, &options) {
                Outcome::Compiled => compiled += 1,
                Outcome::Rejected => rejected += 1,
                Outcome::Failed(f) => failures.push(format!("{name}, {what}: {f}")),
            }
        }
    }
    assert!(total >= 5 * 100, "only {total} mutants");
    // Both outcomes occur, so the mutants reach the checks and the whole pipeline.
    assert!(
        compiled > 0 && rejected > 0,
        "{compiled} compiled, {rejected} rejected of {total}"
    );
    eprintln!(
        "{total} mutants: {compiled} compiled, {rejected} rejected, {} failed",
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {total} mutants failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
