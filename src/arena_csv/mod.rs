//! MiniMalloc CSV instances: parsing with miette diagnostics, solution output, and the
//! `memc bench arena` benchmark table.
// `parse_instance` returns `Result<Instance, CsvError>` by contract; the diagnostic carries its
// source text, so the error is large but only built once on failure.
#![allow(clippy::result_large_err)]

use miette::{NamedSource, SourceSpan};

mod bench;

pub use bench::{capacity_from_name, run_benchmark};

use crate::passes::arena::BufferRequest;

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
    /// The buffers live at one step need more bytes than an arena can address.
    #[error("{name}:{line}: the buffers live at step {step} need more than 2^64-1 bytes")]
    #[diagnostic(
        code(arena_csv::too_large),
        help("offsets are 64-bit: the sizes live at the same time must sum to at most 2^64-1")
    )]
    TooLarge {
        /// File name.
        name: String,
        /// 1-based line number of the buffer whose birth passes the limit.
        line: usize,
        /// The step at which it is passed.
        step: u64,
        /// The whole text.
        #[source_code]
        src: NamedSource<String>,
        /// The row.
        #[label("live with the others at this step, past 2^64-1 bytes")]
        span: SourceSpan,
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
    let mut row_at = Vec::with_capacity(rows.len());
    for line in rows {
        let ((id, span), request) = ctx.row(line, columns)?;
        row_at.push((
            line.number,
            SourceSpan::from((line.offset, line.text.len())),
        ));
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
    if let Some((k, step)) = first_overflow(&inst.requests) {
        let (line, span) = row_at[k];
        return Err(CsvError::TooLarge {
            name: name.to_string(),
            line,
            step,
            src: ctx.src(),
            span,
        });
    }
    Ok(inst)
}

/// The first request (and its start) whose birth brings the bytes live at once past
/// `u64::MAX`, by a sweep over births and deaths (deaths first at the same step).
fn first_overflow(requests: &[BufferRequest]) -> Option<(usize, u64)> {
    let mut events: Vec<(u64, bool, usize)> = requests
        .iter()
        .enumerate()
        .filter(|(_, r)| r.is_live())
        .flat_map(|(k, r)| [(r.start, true, k), (r.end, false, k)])
        .collect();
    events.sort_unstable();
    let mut live = 0u128;
    for (step, birth, k) in events {
        let size = u128::from(requests[k].size);
        if birth {
            live += size;
            if live > u128::from(u64::MAX) {
                return Some((k, step));
            }
        } else {
            live -= size;
        }
    }
    None
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::arena::{self, LayoutOptions};
    use std::path::Path;
    use std::time::Duration;

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
        let max = u64::MAX;
        assert!(matches!(
            parse(&format!(
                "id,lower,upper,size\na,0,2,{max}\nb,2,3,{max}\nc,1,3,1\n"
            )),
            Err(CsvError::TooLarge {
                line: 4,
                step: 1,
                ..
            })
        ));
        assert!(parse(&format!("id,lower,upper,size\na,0,2,{max}\nb,2,3,{max}\n")).is_ok());
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
