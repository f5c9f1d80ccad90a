//! MiniMalloc CSV instances: parsing with miette diagnostics, solution output, and the
#![warn(
    clippy::unwrap_used,
    clippy::panic,
    clippy::todo,
    clippy::dbg_macro,
    clippy::print_stdout
)]
//! `memc bench arena` benchmark table.
// `parse_instance` returns `Result<Instance, CsvError>` by contract; the diagnostic carries its
// source text, so the error is large but only built once on failure.
#![allow(clippy::result_large_err)]

use std::path::Path;
use std::time::{Duration, Instant};

use miette::{NamedSource, SourceSpan};

use crate::passes::arena::{self, BufferRequest, LayoutOptions};

/// A parsed instance: buffer ids and requests, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// The `id` cell of each row (unique).
    pub ids: Vec<String>,
    /// One request per row: `size`, live over `[lower, upper)`.
    pub requests: Vec<BufferRequest>,
}

/// Why a CSV instance was rejected; every case points at the offending cell or line.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum CsvError {
    /// No header line at all.
    #[error("{name}: empty file")]
    #[diagnostic(
        code(arena_csv::empty),
        help("the first line must be the header `id,lower,upper,size`")
    )]
    Empty {
        /// File name.
        name: String,
        /// The whole text.
        #[source_code]
        src: NamedSource<String>,
        /// Start of file.
        #[label("nothing here")]
        span: SourceSpan,
    },
    /// The header is not `id,lower,upper,size` (optionally followed by `,offset`).
    #[error("{name}: unexpected header `{found}`")]
    #[diagnostic(
        code(arena_csv::bad_header),
        help("expected `id,lower,upper,size` (an extra trailing `offset` column is allowed)")
    )]
    BadHeader {
        /// File name.
        name: String,
        /// The header line as found.
        found: String,
        /// The whole text.
        #[source_code]
        src: NamedSource<String>,
        /// The header line.
        #[label("this header")]
        span: SourceSpan,
    },
    /// A row has a different number of cells than the header.
    #[error("{name}:{line}: expected {expected} columns, found {found}")]
    #[diagnostic(
        code(arena_csv::column_count),
        help("every row needs one cell per header column, separated by commas")
    )]
    ColumnCount {
        /// File name.
        name: String,
        /// 1-based line number.
        line: usize,
        /// Header column count.
        expected: usize,
        /// Cells in this row.
        found: usize,
        /// The whole text.
        #[source_code]
        src: NamedSource<String>,
        /// The row.
        #[label("this row")]
        span: SourceSpan,
    },
    /// A `lower`, `upper` or `size` cell is not a non-negative integer.
    #[error("{name}:{line}: `{value}` in column `{column}` is not a non-negative integer")]
    #[diagnostic(
        code(arena_csv::not_integer),
        help("lower, upper and size must be whole numbers between 0 and 2^64-1")
    )]
    NotInteger {
        /// File name.
        name: String,
        /// 1-based line number.
        line: usize,
        /// Column name.
        column: String,
        /// The cell text.
        value: String,
        /// The whole text.
        #[source_code]
        src: NamedSource<String>,
        /// The cell.
        #[label("not a non-negative integer")]
        span: SourceSpan,
    },
    /// A `size` cell is negative.
    #[error("{name}:{line}: negative size `{value}`")]
    #[diagnostic(
        code(arena_csv::negative_size),
        help("sizes are byte counts: use 0 or more")
    )]
    NegativeSize {
        /// File name.
        name: String,
        /// 1-based line number.
        line: usize,
        /// The cell text.
        value: String,
        /// The whole text.
        #[source_code]
        src: NamedSource<String>,
        /// The cell.
        #[label("negative")]
        span: SourceSpan,
    },
    /// `lower >= upper`: the half-open interval is empty.
    #[error("{name}:{line}: lower {lower} is not below upper {upper}")]
    #[diagnostic(
        code(arena_csv::empty_interval),
        help("the lifespan is [lower, upper): upper must be strictly greater than lower")
    )]
    EmptyInterval {
        /// File name.
        name: String,
        /// 1-based line number.
        line: usize,
        /// The lower cell.
        lower: u64,
        /// The upper cell.
        upper: u64,
        /// The whole text.
        #[source_code]
        src: NamedSource<String>,
        /// The row.
        #[label("empty lifespan")]
        span: SourceSpan,
    },
    /// Two rows share an id.
    #[error("{name}:{line}: duplicate id `{id}`")]
    #[diagnostic(code(arena_csv::duplicate_id), help("every buffer id must be unique"))]
    DuplicateId {
        /// File name.
        name: String,
        /// 1-based line number of the repeat.
        line: usize,
        /// The id.
        id: String,
        /// The whole text.
        #[source_code]
        src: NamedSource<String>,
        /// The repeated id cell.
        #[label("repeated here")]
        span: SourceSpan,
        /// The first occurrence.
        #[label("first used here")]
        first: SourceSpan,
    },
}

/// One line of the file with its byte offset.
struct Line<'t> {
    number: usize,
    offset: usize,
    text: &'t str,
}

/// Cells of a line with their byte spans (relative to the file).
fn cells<'t>(line: &Line<'t>) -> Vec<(&'t str, SourceSpan)> {
    let mut out = Vec::new();
    let mut at = line.offset;
    for cell in line.text.split(',') {
        let lead = cell.len() - cell.trim_start().len();
        let trimmed = cell.trim();
        out.push((trimmed, SourceSpan::from((at + lead, trimmed.len()))));
        at += cell.len() + 1;
    }
    out
}

/// Non-blank lines (a trailing `\r` is stripped), numbered from 1.
fn lines(text: &str) -> Vec<Line<'_>> {
    let mut out = Vec::new();
    let mut offset = 0;
    for (i, raw) in text.split('\n').enumerate() {
        let body = raw.strip_suffix('\r').unwrap_or(raw);
        if !body.trim().is_empty() {
            out.push(Line {
                number: i + 1,
                offset,
                text: body,
            });
        }
        offset += raw.len() + 1;
    }
    out
}

/// Parser context: file name and text, for building diagnostics.
struct Ctx<'t> {
    name: &'t str,
    text: &'t str,
}

impl Ctx<'_> {
    fn src(&self) -> NamedSource<String> {
        NamedSource::new(self.name, self.text.to_string())
    }

    /// Parses one integer cell of `line` under `column`.
    fn integer(
        &self,
        line: &Line<'_>,
        column: &str,
        cell: (&str, SourceSpan),
    ) -> Result<u64, CsvError> {
        let (value, span) = cell;
        if let Ok(v) = value.parse::<u64>() {
            return Ok(v);
        }
        let negative = value.starts_with('-') && value[1..].parse::<u64>().is_ok();
        if negative && column == "size" {
            return Err(CsvError::NegativeSize {
                name: self.name.to_string(),
                line: line.number,
                value: value.to_string(),
                src: self.src(),
                span,
            });
        }
        Err(CsvError::NotInteger {
            name: self.name.to_string(),
            line: line.number,
            column: column.to_string(),
            value: value.to_string(),
            src: self.src(),
            span,
        })
    }

    /// Checks the header; returns its column count.
    fn header(&self, line: &Line<'_>) -> Result<usize, CsvError> {
        let names: Vec<String> = cells(line).iter().map(|(c, _)| c.to_lowercase()).collect();
        let base = ["id", "lower", "upper", "size"];
        let ok = names.len() >= 4
            && names.len() <= 5
            && names.iter().zip(base).all(|(n, b)| n == b)
            && (names.len() == 4 || names[4] == "offset");
        if ok {
            return Ok(names.len());
        }
        Err(CsvError::BadHeader {
            name: self.name.to_string(),
            found: line.text.to_string(),
            src: self.src(),
            span: SourceSpan::from((line.offset, line.text.len())),
        })
    }

    /// Parses one data row into (id cell, request).
    fn row<'t>(
        &self,
        line: &Line<'t>,
        columns: usize,
    ) -> Result<((&'t str, SourceSpan), BufferRequest), CsvError> {
        let row = cells(line);
        let row_span = SourceSpan::from((line.offset, line.text.len()));
        if row.len() != columns {
            return Err(CsvError::ColumnCount {
                name: self.name.to_string(),
                line: line.number,
                expected: columns,
                found: row.len(),
                src: self.src(),
                span: row_span,
            });
        }
        let lower = self.integer(line, "lower", row[1])?;
        let upper = self.integer(line, "upper", row[2])?;
        let size = self.integer(line, "size", row[3])?;
        if lower >= upper {
            return Err(CsvError::EmptyInterval {
                name: self.name.to_string(),
                line: line.number,
                lower,
                upper,
                src: self.src(),
                span: row_span,
            });
        }
        let request = BufferRequest {
            size,
            start: lower,
            end: upper,
        };
        Ok((row[0], request))
    }
}

/// Parses a MiniMalloc CSV instance named `name` (used in diagnostics). Accepts the header
/// `id,lower,upper,size`, optionally with a trailing `offset` column whose values are ignored;
/// blank lines and `\r\n` endings are tolerated; a header with no rows is a valid empty
/// instance. Errors carry the source text and a span at the offending cell or line.
pub fn parse_instance(name: &str, text: &str) -> Result<Instance, CsvError> {
    let ctx = Ctx { name, text };
    let all = lines(text);
    let Some((head, rows)) = all.split_first() else {
        return Err(CsvError::Empty {
            name: name.to_string(),
            src: ctx.src(),
            span: SourceSpan::from((0, 0)),
        });
    };
    let columns = ctx.header(head)?;
    let mut seen: std::collections::HashMap<String, SourceSpan> = std::collections::HashMap::new();
    let mut inst = Instance {
        ids: Vec::with_capacity(rows.len()),
        requests: Vec::with_capacity(rows.len()),
    };
    for line in rows {
        let ((id, span), request) = ctx.row(line, columns)?;
        if let Some(&first) = seen.get(id) {
            return Err(CsvError::DuplicateId {
                name: name.to_string(),
                line: line.number,
                id: id.to_string(),
                src: ctx.src(),
                span,
                first,
            });
        }
        seen.insert(id.to_string(), span);
        inst.ids.push(id.to_string());
        inst.requests.push(request);
    }
    Ok(inst)
}

/// Writes `inst` with one offset per buffer as CSV with header `id,lower,upper,size,offset`
/// (a missing offset is written as 0). The output parses back with [`parse_instance`].
pub fn write_solution(inst: &Instance, offsets: &[u64]) -> String {
    let mut out = String::from("id,lower,upper,size,offset\n");
    for (i, (id, r)) in inst.ids.iter().zip(&inst.requests).enumerate() {
        let offset = offsets.get(i).copied().unwrap_or(0);
        out.push_str(&format!("{id},{},{},{},{offset}\n", r.start, r.end, r.size));
    }
    out
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Instance, CsvError> {
        parse_instance("t.csv", text)
    }

    #[test]
    fn parses_the_readme_example_and_round_trips() {
        let text = "id,lower,upper,size\nb1,0,3,4\nb2,3,9,4\nb3,0,9,4\nb4,9,21,4\nb5,0,21,4\n";
        let inst = parse(text).unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(inst.ids, ["b1", "b2", "b3", "b4", "b5"]);
        assert_eq!(
            inst.requests[1],
            BufferRequest {
                size: 4,
                start: 3,
                end: 9
            }
        );
        let offsets = [8, 8, 4, 4, 0];
        let out = write_solution(&inst, &offsets);
        assert!(out.starts_with("id,lower,upper,size,offset\nb1,0,3,4,8\n"));
        let back = parse(&out).unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(back, inst);
        assert_eq!(capacity_from_name("input.12.csv"), Some(12));
        assert_eq!(capacity_from_name("plain.csv"), None);
    }

    #[test]
    fn each_error_case_has_its_variant() {
        assert!(matches!(parse(""), Err(CsvError::Empty { .. })));
        assert!(matches!(parse("\n \n"), Err(CsvError::Empty { .. })));
        assert!(matches!(
            parse("id,start,end,size\n"),
            Err(CsvError::BadHeader { .. })
        ));
        assert!(matches!(
            parse("id,lower,upper,size\na,0,1\n"),
            Err(CsvError::ColumnCount {
                line: 2,
                expected: 4,
                found: 3,
                ..
            })
        ));
        assert!(matches!(
            parse("id,lower,upper,size\na,0,x,4\n"),
            Err(CsvError::NotInteger { line: 2, .. })
        ));
        assert!(matches!(
            parse("id,lower,upper,size\na,0,1,-4\n"),
            Err(CsvError::NegativeSize { line: 2, .. })
        ));
        assert!(matches!(
            parse("id,lower,upper,size\na,3,3,4\n"),
            Err(CsvError::EmptyInterval {
                line: 2,
                lower: 3,
                upper: 3,
                ..
            })
        ));
        assert!(matches!(
            parse("id,lower,upper,size\na,0,1,4\na,1,2,4\n"),
            Err(CsvError::DuplicateId { line: 3, .. })
        ));
    }

    #[test]
    fn labels_point_at_the_offending_cell() {
        let text = "id,lower,upper,size\na,0,1,4\nb,0,zz,4\n";
        match parse(text) {
            Err(CsvError::NotInteger { span, column, .. }) => {
                assert_eq!(column, "upper");
                assert_eq!(&text[span.offset()..span.offset() + span.len()], "zz");
            }
            other => unreachable!("{other:?}"),
        }
    }

    #[test]
    fn offset_column_and_crlf_are_accepted() {
        let inst = parse("id,lower,upper,size,offset\r\na,0,2,5,0\r\n")
            .unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(
            inst.requests,
            [BufferRequest {
                size: 5,
                start: 0,
                end: 2
            }]
        );
    }

    #[test]
    fn tiny_benchmark_instance_meets_capacity() {
        let dir = Path::new("/work/shared/benchmarks/minimalloc/input.12.csv");
        let Ok(text) = std::fs::read_to_string(dir) else {
            return; // benchmark data not present on this machine
        };
        let inst = parse_instance("input.12.csv", &text).unwrap_or_else(|e| unreachable!("{e}"));
        let options = LayoutOptions {
            alignment: 1,
            time_limit: Duration::from_millis(100),
            capacity: Some(12),
        };
        let result = arena::layout(&inst.requests, &options);
        assert_eq!(result.size, 12);
        assert_eq!(
            arena::validate(&inst.requests, &result.offsets, 12, 1),
            Ok(())
        );
    }
}
