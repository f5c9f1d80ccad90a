//! How a training step is spread over devices: `train { parallel = (data = N, zero = K,
//! tensor = T, pipeline = P, microbatches = M) }` and `--parallel data=N,zero=K,...` read
//! into one [`Parallel`], with
//! one reader of their `key = value` pairs so the file and the flag accept and refuse the
//! same things.

use crate::diagnostic::UserError;
use crate::ir::Span;
use serde::{Deserialize, Serialize};

/// Data parallelism over `data` ranks with ZeRO stage `zero`: each rank runs the model on a
/// batch of its own, the model's batch as written (`batch = per_rank`, the default, as
/// DeepSpeed's micro-batch per GPU), or `1/data` of it (`batch = global`); stage 1 shards
/// the optimizer state over the ranks, stage 2 also the gradients, stage 3 also the
/// parameters (gathered just in time for each use).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Parallel {
    /// Data-parallel ranks (1 to [`MAX_RANKS`]).
    pub data: u32,
    /// ZeRO stage, 0 to 3.
    pub zero: u8,
    /// Whether the model's batch dim is the whole step's batch, split over the ranks
    /// (`batch = global`), rather than each rank's (`batch = per_rank`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub global_batch: bool,
    /// Tensor-parallel ranks per replica (1: no tensor split).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub tensor: u32,
    /// Pipeline stages per replica (1: no pipeline): each holds a contiguous run of the
    /// model's blocks and exchanges activations and their gradients with its neighbours.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub pipeline: u32,
    /// Micro-batches each replica's batch is cut into, run through the stages in 1F1B order
    /// (1 without a pipeline).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub microbatches: u32,
}

/// 1, the default rank count of a serialized layout.
pub(crate) fn one() -> u32 {
    1
}

/// Whether a serialized rank count is the default, 1 (left out).
pub(crate) fn is_one(n: &u32) -> bool {
    *n == 1
}

impl Default for Parallel {
    /// One rank: no data or tensor split, ZeRO-0, the batch per rank.
    fn default() -> Parallel {
        Parallel {
            data: 1,
            zero: 0,
            global_batch: false,
            tensor: 1,
            pipeline: 1,
            microbatches: 1,
        }
    }
}

/// A value as written after `key =`: a number, a word, or something else (its span says
/// where).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Setting<'a> {
    /// A number as written.
    Number(f64),
    /// One word (`global`).
    Word(&'a str),
    /// Anything else (a tuple, a call, nothing).
    Other,
}

/// One `key = value` pair with the spans of the key and of the value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pair<'a> {
    /// The key as written.
    pub key: &'a str,
    /// Where the key is.
    pub key_span: Span,
    /// The value.
    pub value: Setting<'a>,
    /// Where the value is.
    pub value_span: Span,
}

/// The most ranks a layout may have (the report lists each).
pub const MAX_RANKS: u32 = 65_536;

/// The keys [`Parallel::from_pairs`] accepts.
pub const KEYS: [&str; 7] = [
    "data",
    "zero",
    "batch",
    "tensor",
    "pipeline",
    "microbatches",
    "sequence_parallel",
];

impl Parallel {
    /// Ranks that hold one shard each of what ZeRO shards (all data-parallel ranks).
    pub fn ranks(&self) -> u32 {
        self.data
    }

    /// Every rank of the layout: `data` replicas of `tensor` ranks each, times `pipeline`
    /// stages. Rank `r` is stage `r / (data * tensor)` and, within its stage's ranks
    /// `q = r % (data * tensor)`, tensor rank `q % tensor` of replica `q / tensor` (a
    /// replica's tensor ranks are adjacent, as Megatron places them within a node).
    pub fn world(&self) -> u32 {
        (self.data.saturating_mul(self.tensor)).saturating_mul(self.pipeline)
    }

    /// Reads the pairs of a `parallel` setting. `data` is a whole number of ranks of at
    /// least 1 (default 1), `zero` a stage 0 to 3 (default 0), `tensor` a whole number of
    /// tensor-parallel ranks (default 1), `pipeline` a whole number of stages (default 1)
    /// and `microbatches` of micro-batches (default 1), given only with `pipeline`;
    /// `sequence_parallel = off` is accepted and `on` refused (not planned yet). The ranks
    /// of all kinds multiply to at most [`MAX_RANKS`].
    /// Every refusal names the pair's span; a key given twice is refused.
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = Pair<'a>>,
    ) -> Result<Parallel, UserError> {
        let mut out = Parallel::default();
        let mut world_span = None;
        let mut seen: Vec<&str> = Vec::new();
        for p in pairs {
            if !KEYS.contains(&p.key) {
                return Err(UserError::at(
                    p.key_span,
                    format!("unknown parallel setting `{}`", p.key),
                    "unknown",
                    format!("accepted: {}", KEYS.join(", ")),
                ));
            }
            if seen.contains(&p.key) {
                return Err(UserError::at(
                    p.key_span,
                    format!("`{}` is given twice", p.key),
                    "again",
                    "give each parallel setting once",
                ));
            }
            seen.push(p.key);
            match p.key {
                "data" => (out.data, world_span) = (count(&p)?, Some(p.value_span)),
                "tensor" => (out.tensor, world_span) = (count(&p)?, Some(p.value_span)),
                "pipeline" => (out.pipeline, world_span) = (count(&p)?, Some(p.value_span)),
                "microbatches" => out.microbatches = count(&p)?,
                "zero" => out.zero = stage(&p)?,
                "batch" => out.global_batch = global(&p)?,
                "sequence_parallel" if !switch(&p)? => {}
                _ => return Err(unsupported(&p)),
            }
        }
        if let (true, Some(span)) = (
            u64::from(out.data) * u64::from(out.tensor) * u64::from(out.pipeline)
                > u64::from(MAX_RANKS),
            world_span,
        ) {
            return Err(UserError::at(
                span,
                format!("`data` times `tensor` times `pipeline` is at most {MAX_RANKS} ranks"),
                "too many",
                "plan a smaller job: the report lists every rank",
            ));
        }
        if seen.contains(&"microbatches") && out.pipeline == 1 {
            return Err(UserError::general(
                "`microbatches` cuts the batch for a pipeline, and `pipeline` is not given",
                "add `pipeline = P` (P stages, at least 2), e.g. `pipeline = 2, microbatches = 4`",
            ));
        }
        if seen.contains(&"zero") && !seen.contains(&"data") {
            return Err(UserError::general(
                "ZeRO shards state over data-parallel ranks, and `data` is not given",
                "add `data = N`, e.g. `data = 8, zero = 1`",
            ));
        }
        Ok(out)
    }

    /// Reads `--parallel`'s text, `data=N,zero=K`: the pairs separated by commas, each
    /// `key=value`; spans are byte ranges of `text`.
    pub fn parse_flag(text: &str) -> Result<Parallel, UserError> {
        let mut pairs = Vec::new();
        let mut start = 0;
        for part in text.split(',') {
            let span = Span::new(start, start + part.len());
            start += part.len() + 1;
            let Some((key, value)) = part.split_once('=') else {
                return Err(UserError::at(
                    span,
                    format!("`{part}` is not a `key=value` pair"),
                    "no `=`",
                    "write e.g. `--parallel data=8,zero=1`",
                ));
            };
            let key_at = span.start + (key.len() - key.trim_start().len());
            let value_at = span.start + key.len() + 1;
            let value_start = value_at + (value.len() - value.trim_start().len());
            let value = value.trim();
            pairs.push(Pair {
                key: key.trim(),
                key_span: Span::new(key_at, key_at + key.trim().len()),
                value: match value.parse::<f64>() {
                    Ok(n) => Setting::Number(n),
                    Err(_) if !value.is_empty() => Setting::Word(value),
                    Err(_) => Setting::Other,
                },
                value_span: Span::new(value_start, value_start + value.len()),
            });
        }
        Parallel::from_pairs(pairs)
    }
}

/// How a tensor-parallel rank holds its slice of a parameter: along `axis`, the full
/// extent is the contiguous `parts` in order (a fused q, k, v projection's three column
/// blocks; one part otherwise), and rank `r` of `ranks` holds the `r`-th of `ranks` equal
/// pieces of every part, in part order. Every part divides by `ranks`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorSplit {
    /// The parameter's whole shape.
    pub full: Vec<usize>,
    /// The dim the ranks split.
    pub axis: usize,
    /// The extents of the parts along `axis`, summing to `full[axis]`.
    pub parts: Vec<usize>,
    /// Tensor-parallel ranks.
    pub ranks: u32,
}

impl TensorSplit {
    /// The shape each rank holds: `full` with `axis` divided by the ranks.
    pub fn local_shape(&self) -> Vec<usize> {
        let mut shape = self.full.clone();
        if let Some(d) = shape.get_mut(self.axis) {
            *d /= self.ranks.max(1) as usize;
        }
        shape
    }

    /// The flat index in the whole parameter of element `local` (a flat index into
    /// [`TensorSplit::local_shape`]) of rank `rank`'s slice.
    pub fn global_index(&self, local: usize, rank: usize) -> usize {
        let ranks = self.ranks.max(1) as usize;
        let inner: usize = self.full.iter().skip(self.axis + 1).product();
        let extent = self.full.get(self.axis).copied().unwrap_or(1);
        let local_extent = extent / ranks;
        let (outer, rest) = (
            local / (local_extent * inner),
            local % (local_extent * inner),
        );
        let (mut a, i) = (rest / inner, rest % inner);
        let mut part_start = 0;
        for &part in &self.parts {
            let piece = part / ranks;
            if a < piece {
                let global = part_start + rank * piece + a;
                return (outer * extent + global) * inner + i;
            }
            a -= piece;
            part_start += part;
        }
        (outer * extent + part_start + a) * inner + i
    }
}

/// The model-state bytes per device of ZeRO stage `stage` by the ZeRO paper's accounting
/// (Rajbhandari et al., SC'20, Figure 1): `params` parameters in mixed precision with 2
/// bytes of fp16 parameters, 2 of fp16 gradients and `k` of optimizer state (12 for Adam:
/// fp32 master weights, momentum and variance) per parameter, over `ranks` devices; stage 1
/// divides the optimizer state by the devices, stage 2 also the gradients, stage 3 also the
/// parameters. Rounded down to whole bytes. Memc's own figures are the plan's buffers
/// (`report.parallel`): it keeps this layout under ZeRO-1 and 2 with mixed precision for
/// the weights that only matmuls read (tensors that fp32 ops read stay fp32 and whole), and
/// this formula counts no activations and no buffers of the collectives.
pub fn paper_model_states(params: u64, k: u64, ranks: u64, stage: u8) -> u64 {
    let n = ranks.max(1);
    let (p, g, o) = (2 * params, 2 * params, k * params);
    match stage {
        0 => p + g + o,
        1 => p + g + o / n,
        2 => p + (g + o) / n,
        _ => (p + g + o) / n,
    }
}

/// The whole number of at least 1 that `p` holds.
fn count(p: &Pair) -> Result<u32, UserError> {
    match p.value {
        Setting::Number(n) if n.fract() == 0.0 && n >= 1.0 && n <= f64::from(MAX_RANKS) => {
            Ok(n as u32)
        }
        Setting::Number(n) if n.fract() == 0.0 && n > f64::from(MAX_RANKS) => Err(UserError::at(
            p.value_span,
            format!("`{}` is at most {MAX_RANKS} ranks", p.key),
            "too many",
            "plan a smaller job: the report lists every rank",
        )),
        _ => Err(UserError::at(
            p.value_span,
            format!("`{}` must be a whole number of at least 1", p.key),
            "not a count",
            match p.key {
                "data" => "write e.g. `data = 8`: eight ranks, each with 1/8 of the batch".into(),
                key => format!("write `{key} = 1`"),
            },
        )),
    }
}

/// Whether `p` says `on` (true) or `off` (false).
fn switch(p: &Pair) -> Result<bool, UserError> {
    match p.value {
        Setting::Word("on") => Ok(true),
        Setting::Word("off") => Ok(false),
        _ => Err(UserError::at(
            p.value_span,
            format!("`{}` is `on` or `off`", p.key),
            "not a switch",
            format!("write `{} = off`", p.key),
        )),
    }
}

/// Whether `p` says the batch is the whole step's (`global`) or each rank's (`per_rank`).
fn global(p: &Pair) -> Result<bool, UserError> {
    match p.value {
        Setting::Word("global") => Ok(true),
        Setting::Word("per_rank") => Ok(false),
        _ => Err(UserError::at(
            p.value_span,
            "`batch` is `per_rank` or `global`",
            "not a batch mode",
            "`per_rank` (the default): every rank runs the model's batch; `global`: the \
             model's batch dim is split over the ranks",
        )),
    }
}

/// The ZeRO stage `p` holds.
fn stage(p: &Pair) -> Result<u8, UserError> {
    match p.value {
        Setting::Number(n) if n.fract() == 0.0 && (0.0..=3.0).contains(&n) => Ok(n as u8),
        _ => Err(not_a_stage(p)),
    }
}

fn not_a_stage(p: &Pair) -> UserError {
    UserError::at(
        p.value_span,
        "`zero` is a ZeRO stage: 0, 1, 2 or 3",
        "not a stage",
        "write `zero = 0` (replicated), 1 (optimizer state sharded), 2 (and gradients) or 3 \
         (and parameters)",
    )
}

/// `sequence_parallel = on` (the only setting left that memc does not plan).
fn unsupported(p: &Pair) -> UserError {
    UserError::at(
        p.key_span,
        format!(
            "`{}` asks for sequence parallelism (norm and dropout activations split along \
             the sequence), which memc does not plan yet",
            p.key
        ),
        "not supported yet",
        "plan `tensor = T` without it: each all-reduce stays whole",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_reads_data_and_zero() {
        assert_eq!(
            Parallel::parse_flag("data=8,zero=3"),
            Ok(Parallel {
                data: 8,
                zero: 3,
                ..Parallel::default()
            })
        );
        assert_eq!(
            Parallel::parse_flag(" data = 4 , tensor=1,batch=global"),
            Ok(Parallel {
                data: 4,
                global_batch: true,
                ..Parallel::default()
            })
        );
        let split = Parallel::parse_flag("data=2,tensor=4,sequence_parallel=off");
        assert_eq!(split.map(|p| (p.world(), p.ranks())), Ok((8, 2)));
        let stages = Parallel::parse_flag("data=2,pipeline=3,microbatches=4");
        assert_eq!(
            stages.map(|p| (p.world(), p.ranks(), p.microbatches)),
            Ok((6, 2, 4))
        );
        let e = Parallel::parse_flag("data=2,microbatches=4").expect_err("no pipeline");
        assert!(
            e.message.contains("`pipeline` is not given"),
            "{}",
            e.message
        );
    }

    /// The ZeRO paper's Figure 1 example: 7.5B parameters, K = 12, 64 devices.
    #[test]
    fn paper_table_reproduces() {
        let bytes = [0, 1, 2, 3].map(|s| paper_model_states(7_500_000_000, 12, 64, s));
        assert_eq!(
            bytes,
            [
                120_000_000_000,
                31_406_250_000,
                16_640_625_000,
                1_875_000_000
            ]
        );
        let gb = bytes.map(|b| format!("{:.1}", b as f64 / 1e9));
        assert_eq!(gb, ["120.0", "31.4", "16.6", "1.9"]);
    }

    /// A fused q, k, v projection `[2, 6]` over 2 ranks: rank 1 holds the second column of
    /// each of the three blocks of two.
    #[test]
    fn split_parts_map_to_their_columns() {
        let split = TensorSplit {
            full: vec![2, 6],
            axis: 1,
            parts: vec![2, 2, 2],
            ranks: 2,
        };
        assert_eq!(split.local_shape(), vec![2, 3]);
        let rank1: Vec<usize> = (0..6).map(|i| split.global_index(i, 1)).collect();
        assert_eq!(rank1, vec![1, 3, 5, 7, 9, 11]);
        let rows = TensorSplit {
            full: vec![4, 3],
            axis: 0,
            parts: vec![4],
            ranks: 2,
        };
        let rank1: Vec<usize> = (0..6).map(|i| rows.global_index(i, 1)).collect();
        assert_eq!(rank1, vec![6, 7, 8, 9, 10, 11]);
    }

    #[test]
    fn flag_refusals_point_at_the_value() {
        for (text, span, message) in [
            ("data=8,zero=4", (12, 13), "ZeRO stage"),
            ("data=0", (5, 6), "at least 1"),
            ("data=2.5", (5, 8), "at least 1"),
            (
                "data=8,sequence_parallel=on",
                (7, 24),
                "sequence parallelism",
            ),
            ("tensor=2,sequence_parallel=yes", (27, 30), "`on` or `off`"),
            ("data=65536,tensor=2", (18, 19), "times `tensor`"),
            ("data=2,pipeline=0", (16, 17), "at least 1"),
            ("data=8,pipe=2", (7, 11), "unknown parallel setting"),
            ("data=8,zero", (7, 11), "not a `key=value`"),
            ("data=2,data=4", (7, 11), "twice"),
            ("data=2,batch=local", (13, 18), "per_rank"),
            ("data=4294967295", (5, 15), "at most 65536 ranks"),
        ] {
            let e = Parallel::parse_flag(text).expect_err(text);
            assert_eq!(e.span, Some(Span::new(span.0, span.1)), "{text}");
            assert!(e.message.contains(message), "{text}: {}", e.message);
        }
    }
}
