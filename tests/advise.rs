//! `memc advise`: every row is a compiled plan, judged against the budget, best first.
#![allow(clippy::panic, clippy::unwrap_used)]

mod common;

use memc::advise::advise;
use memc::Options;

#[test]
fn rows_are_compiled_plans_sorted_best_first() {
    let src = common::example("gpt2");
    let options = Options {
        overrides: common::tiny_gpt(4),
        ..Options::default()
    };
    let keep_all = Options {
        checkpoint: memc::budget::CheckpointMode::KeepAll,
        ..options.clone()
    };
    let keep = memc::compile(&src, &keep_all)
        .unwrap()
        .plan
        .plan()
        .arena_bytes;
    let budget = keep * 9 / 10;
    let rows = advise(&src, &options, budget);
    assert_eq!(rows.len(), 23);
    let arena = |option: &str| {
        let row = rows.iter().find(|r| r.option.starts_with(option)).unwrap();
        row.arena_bytes.unwrap()
    };
    assert!(arena("QLoRA r=16") < arena("LoRA r=16"), "{rows:?}");
    // Saved activations on the host: a smaller device arena than keeping them, selected by
    // its flag, and priced by its copies.
    let host = rows
        .iter()
        .find(|r| r.option == "activations on the host")
        .unwrap();
    assert!(arena("activations on the host") < keep, "{host:?}");
    assert!(
        host.flags.join(" ").contains("--offload activations"),
        "{host:?}"
    );
    assert!(host.note.contains("offload adds"), "{host:?}");
    for r in &rows {
        if let Some(a) = r.arena_bytes {
            assert_eq!(r.fits, a <= budget, "{r:?}");
        }
    }
    let naive = rows
        .iter()
        .find(|r| r.option == "keep every activation")
        .unwrap();
    assert_eq!(naive.arena_bytes, Some(keep));
    assert!(!naive.fits);
    let first_unfit = rows.iter().position(|r| !r.fits).unwrap_or(rows.len());
    assert!(
        rows[first_unfit..].iter().all(|r| !r.fits),
        "fitting rows come first"
    );
    assert!(rows[0].fits && rows[0].keeps_batch, "{:?}", rows[0]);
    let accumulation = rows
        .iter()
        .find(|r| r.option == "gradient accumulation")
        .unwrap();
    assert!(
        accumulation.fits && accumulation.keeps_batch,
        "{accumulation:?}"
    );
    assert!(
        accumulation.note.starts_with("B = 4 as "),
        "{accumulation:?}"
    );
}

/// Each row's flags, added to the command line advised on, compile to the row's plan; the
/// frontier rows fit, keep the batch and are not dominated in bytes and estimated time; a
/// combined row (bf16 with checkpointing to fit) is among the rows.
#[test]
fn rows_say_the_flags_that_select_them_and_mark_the_frontier() {
    let src = common::example("gpt2");
    let dims = common::tiny_gpt(4);
    // Without the layout search, whose wall-clock cap makes a loaded machine's layouts
    // differ from run to run, the row and the command line lay out the same.
    let options = Options {
        overrides: dims.clone(),
        layout_time: std::time::Duration::ZERO,
        ..Options::default()
    };
    let keep = memc::compile(&src, &options)
        .unwrap()
        .plan
        .plan()
        .arena_bytes;
    let rows = advise(&src, &options, keep * 8 / 10);
    let sets: Vec<String> = dims
        .iter()
        .flat_map(|(k, v)| ["--set".to_string(), format!("{k}={v}")])
        .collect();
    for r in rows.iter().filter(|r| r.arena_bytes.is_some()) {
        assert!(!r.flags.is_empty(), "{r:?}");
        let mut args = vec!["compile", "examples/gpt2.mdl", "--format", "json"];
        args.extend(["--layout-time", "0"]);
        args.extend(sets.iter().map(String::as_str));
        args.extend(r.flags.iter().map(String::as_str));
        let out = common::memc(&args);
        common::assert_success(&out);
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            report["report"]["bytes"]["arena"].as_u64(),
            r.arena_bytes,
            "{}: {:?}",
            r.option,
            r.flags
        );
    }
    let frontier: Vec<_> = rows.iter().filter(|r| r.frontier).collect();
    assert!(!frontier.is_empty());
    for f in &frontier {
        assert!(f.fits && f.keeps_batch, "{f:?}");
        let (a, t) = (f.arena_bytes.unwrap(), f.step_seconds.unwrap());
        assert!(
            !rows.iter().any(|r| r.fits
                && r.keeps_batch
                && r.arena_bytes.is_some_and(|b| b <= a)
                && r.step_seconds.is_some_and(|u| u <= t)
                && (r.arena_bytes < f.arena_bytes || r.step_seconds < f.step_seconds)),
            "{f:?} is dominated"
        );
    }
    assert!(rows
        .iter()
        .any(|r| r.option == "bf16 mixed precision + checkpointing to fit" && r.fits));
}

/// `memc advise` with `--parallel data=4`: rows for the other stages over 4 ranks, for
/// ZeRO-3 over 2 and 8, and for the 4 GPUs split over tensor = 2 and 4, each fitted to the
/// budget, its arena per rank and its note saying each rank's bytes. Tensor = 4 (no data
/// parallelism left) fits and ranks first.
#[test]
fn advise_compares_layouts() {
    let dims = [
        ("L", 2),
        ("D", 64),
        ("T", 32),
        ("V", 256),
        ("H", 4),
        ("B", 2),
    ];
    let o = Options {
        overrides: common::overrides(&dims),
        precision: Some(memc::settings::Precision::Fp32),
        parallel: Some(memc::parallel::Parallel {
            data: 4,
            zero: 0,
            ..memc::parallel::Parallel::default()
        }),
        ..Options::default()
    };
    let rows = advise(&common::example("gpt2"), &o, 1000 << 10);
    let split = |data: u32, tensor: u32, zero: u8| {
        let (name, flag) = match tensor {
            1 => (
                format!("data = {data}, ZeRO-{zero} + checkpointing to fit"),
                format!("data={data},zero={zero}"),
            ),
            t => (
                format!("data = {data}, tensor = {t}, ZeRO-{zero} + checkpointing to fit"),
                format!("data={data},zero={zero},tensor={t}"),
            ),
        };
        let Some(row) = rows.iter().find(|r| r.option == name) else {
            panic!("no row {name}");
        };
        // A row without a plan says why instead of its flags.
        assert!(!row.fits || row.flags[..2] == ["--parallel".to_string(), flag]);
        (row.fits, row.arena_bytes)
    };
    let layout = |data: u32, zero: u8| split(data, 1, zero);
    assert_eq!(split(1, 4, 0), (true, Some(858_628)));
    assert_eq!(split(2, 2, 0), (false, None));
    assert_eq!(layout(4, 3), (true, Some(970_500)));
    assert_eq!(layout(8, 3), (true, Some(795_396)));
    assert_eq!(layout(2, 3), (false, None));
    assert_eq!(layout(4, 1), (false, None));
    assert_eq!(layout(4, 2), (false, None));
    assert!(!rows
        .iter()
        .any(|r| r.option.starts_with("data = 4, ZeRO-0")));
    let Some(best) = rows.first() else {
        panic!("no rows");
    };
    assert!(
        best.note
            .contains("per rank: params 172.4 KiB, grads 172.4 KiB, optimizer 344.8 KiB"),
        "{}",
        best.note
    );
}

/// The text table's columns line up: every row's arena figure ends where the header's
/// `arena` does, however long the option's name (the QLoRA rows are the longest).
#[test]
fn the_text_table_columns_line_up() {
    let dims: Vec<String> = common::tiny_gpt(4)
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let mut args = vec!["advise", "examples/gpt2.mdl", "--budget", "3MiB"];
    for d in &dims {
        args.extend(["--set", d]);
    }
    let out = common::memc(&args);
    common::assert_success(&out);
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines().skip(1);
    let header = lines.next().unwrap();
    let end = header.find("arena").unwrap() + "arena".len();
    let mut rows = 0;
    for line in lines {
        let before: String = line.chars().take(end).collect();
        assert!(
            before.ends_with("iB") || before.ends_with(" B") || before.ends_with('-'),
            "arena column misaligned in {line:?} (header {header:?})"
        );
        rows += 1;
    }
    assert!(rows > 10, "{text}");
    assert!(text.contains("QLoRA"), "{text}");
}
