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
    assert_eq!(rows.len(), 13);
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
