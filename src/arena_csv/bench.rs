//! The `memc bench arena` table: every MiniMalloc instance of a folder laid out by first-fit,
//! the heuristic and the full search, against its lower bound and capacity.

use std::path::Path;
use std::time::{Duration, Instant};

use super::{parse_instance, Instance};
use crate::passes::arena::{self, BufferRequest, LayoutOptions};

/// Capacity encoded in a MiniMalloc file name (`A.1048576.csv` -> 1048576).
pub fn capacity_from_name(file_name: &str) -> Option<u64> {
    let stem = file_name.strip_suffix(".csv")?;
    stem.rsplit('.').next()?.parse().ok()
}

/// Measurements of one instance.
struct Row {
    name: String,
    buffers: usize,
    lower: u64,
    capacity: Option<u64>,
    first_fit: u64,
    heuristic: u64,
    heuristic_ms: f64,
    search: u64,
    search_ms: f64,
    valid: bool,
    optimal: bool,
}

/// Lays out one instance three ways (first-fit, heuristic only, heuristic + search).
fn measure(name: String, inst: &Instance, time_limit: Duration) -> Row {
    let capacity = capacity_from_name(&name);
    let reqs = &inst.requests;
    let ff = arena::first_fit(reqs, 1);
    let ff_size = size_of(reqs, &ff);
    let quick = LayoutOptions {
        alignment: 1,
        time_limit: Duration::ZERO,
        capacity,
    };
    let t = Instant::now();
    let heuristic = arena::layout(reqs, &quick);
    let heuristic_ms = t.elapsed().as_secs_f64() * 1e3;
    let full = LayoutOptions {
        time_limit,
        ..quick
    };
    let t = Instant::now();
    let result = arena::layout(reqs, &full);
    let search_ms = t.elapsed().as_secs_f64() * 1e3;
    let valid = arena::validate(reqs, &result.offsets, result.size, 1).is_ok()
        && capacity.is_none_or(|c| result.size <= c);
    Row {
        name,
        buffers: reqs.len(),
        lower: arena::lower_bound(reqs, 1),
        capacity,
        first_fit: ff_size,
        heuristic: heuristic.size,
        heuristic_ms,
        search: result.size,
        search_ms,
        valid,
        optimal: result.optimal,
    }
}

/// max(offset + size).
fn size_of(reqs: &[BufferRequest], offsets: &[u64]) -> u64 {
    reqs.iter()
        .zip(offsets)
        .map(|(r, o)| o + r.size)
        .max()
        .unwrap_or(0)
}

/// Runs every `*.csv` instance in `dir` (sorted by file name; capacity from the file name)
/// through first-fit, the heuristic, and the full search with `time_limit`, and returns a
/// plain-text table: instance, buffers, lower bound, capacity, first-fit ratio, heuristic
/// ratio and ms, search ratio and ms, whether the result is valid and within capacity,
/// followed by geometric-mean ratios and the median search time. Ratios are size / lower
/// bound. I/O and parse failures become `std::io::Error`s.
pub fn run_benchmark(dir: &Path, time_limit: Duration) -> Result<String, std::io::Error> {
    let mut files: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "csv"))
        .collect();
    files.sort();
    let mut rows = Vec::new();
    for path in files {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let text = std::fs::read_to_string(&path)?;
        let inst = parse_instance(&name, &text)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
        rows.push(measure(name, &inst, time_limit));
    }
    Ok(format_table(&rows))
}

/// size / bound, 1.0 for empty instances.
fn ratio(size: u64, bound: u64) -> f64 {
    if bound == 0 {
        1.0
    } else {
        size as f64 / bound as f64
    }
}

/// Renders the rows and a summary line.
fn format_table(rows: &[Row]) -> String {
    let mut out = format!(
        "{:<16} {:>7} {:>10} {:>10} {:>8} {:>8} {:>9} {:>8} {:>9} {:>5} {:>4}\n",
        "instance",
        "buffers",
        "lower",
        "capacity",
        "ff",
        "heur",
        "heur_ms",
        "search",
        "search_ms",
        "fits",
        "opt"
    );
    for r in rows {
        let cap = r.capacity.map_or("-".to_string(), |c| c.to_string());
        out.push_str(&format!(
            "{:<16} {:>7} {:>10} {:>10} {:>8.4} {:>8.4} {:>9.1} {:>8.4} {:>9.1} {:>5} {:>4}\n",
            r.name,
            r.buffers,
            r.lower,
            cap,
            ratio(r.first_fit, r.lower),
            ratio(r.heuristic, r.lower),
            r.heuristic_ms,
            ratio(r.search, r.lower),
            r.search_ms,
            if r.valid { "yes" } else { "NO" },
            if r.optimal { "yes" } else { "no" },
        ));
    }
    let geo = |f: &dyn Fn(&Row) -> f64| {
        let n = rows.len().max(1) as f64;
        (rows.iter().map(|r| f(r).ln()).sum::<f64>() / n).exp()
    };
    let mut times: Vec<f64> = rows.iter().map(|r| r.search_ms).collect();
    times.sort_by(f64::total_cmp);
    let median = times.get(times.len() / 2).copied().unwrap_or(0.0);
    out.push_str(&format!(
        "geomean ratio: first-fit {:.4}, heuristic {:.4}, search {:.4}; median search {:.1} ms; {} of {} within capacity\n",
        geo(&|r| ratio(r.first_fit, r.lower)),
        geo(&|r| ratio(r.heuristic, r.lower)),
        geo(&|r| ratio(r.search, r.lower)),
        median,
        rows.iter().filter(|r| r.valid).count(),
        rows.len(),
    ));
    out
}
