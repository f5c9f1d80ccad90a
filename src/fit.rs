//! `fit`: the largest value of one dim for which the compiled step fits a memory budget,
//! found by searching over real compiles (exponential probe, then binary search).
//!
//! Nothing here is a formula: every value the search reports on was compiled, laid out and
//! verified, and its arena compared with the budget. The search assumes the arena grows with
//! the dim; it always ends on a pair `value` (fits) and `value + 1` (does not fit), both
//! compiled, so the answer's boundary is exact even where that assumption would fail
//! elsewhere.

use crate::plan::{Bytes, VerifiedPlan};
use crate::{compile, CompileError, Options};
use std::fmt;

/// Values above this are not probed: a dim that can grow this far without leaving the
/// budget does not bound the step's memory.
pub const MAX_FIT_VALUE: i64 = 1 << 40;

/// One compile of the search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// The dim's value in this compile.
    pub value: i64,
    /// The arena the compiled plan needs.
    pub arena_bytes: u64,
    /// Whether the plan's budgeted bytes (the arena, on a GPU with the CUDA context's
    /// reserve) are within the budget.
    pub fits: bool,
    /// `arena_bytes` is of the plan compiled without a budget, because the compiler found
    /// no plan within it (with checkpointing, the least it could do is not reported).
    pub without_budget: bool,
    /// The model does not compile at this value (a rule such as a dim that must divide
    /// another): no plan, `arena_bytes` 0, counted as not fitting.
    pub refused: bool,
}

/// The answer of [`fit_dim`].
#[derive(Debug, Clone)]
pub struct FitResult {
    /// The dim searched.
    pub dim: String,
    /// The largest value found whose plan fits the budget.
    pub value: i64,
    /// The arena at `value` (at most the budget).
    pub arena_bytes: u64,
    /// The next value searched (`value + multiple_of`), which does not fit.
    pub next_value: i64,
    /// The arena at `next_value` (more than the budget).
    pub next_arena_bytes: u64,
    /// `next_arena_bytes` is of the plan at `next_value` compiled without a budget, because
    /// no plan within the budget was found there.
    pub next_without_budget: bool,
    /// Why the model does not compile at `next_value`, when it does not (the search counts
    /// such a value as not fitting: the answer is then the largest value found that compiles
    /// and fits below it).
    pub next_refusal: Option<String>,
    /// The budget searched against.
    pub budget: u64,
    /// The dim's value in the file (after the other `--set` overrides): where the search began.
    pub start: i64,
    /// The verified plan at `value`.
    pub plan: VerifiedPlan,
    /// Every compile of the search, in order.
    pub probes: Vec<Probe>,
}

/// The answer of [`fit_accumulation`]: `batch` reached as `accumulate` micro-batches of
/// `micro_batch`.
#[derive(Debug, Clone)]
pub struct AccumulationFit {
    /// The batch dim.
    pub dim: String,
    /// The dim's value in the file: the batch each update sees.
    pub batch: i64,
    /// The largest divisor of `batch` whose plan fits.
    pub micro_batch: i64,
    /// `batch / micro_batch`: micro-steps per update.
    pub accumulate: u32,
    /// The arena of the fitting plan (at most the budget).
    pub arena_bytes: u64,
    /// The next larger divisor of `batch` (none when `micro_batch == batch`) and its arena,
    /// which exceeds the budget.
    pub next: Option<Probe>,
    /// The budget searched against.
    pub budget: u64,
    /// The verified plan at `micro_batch`, accumulating `accumulate` micro-steps.
    pub plan: VerifiedPlan,
    /// Every compile, largest micro-batch first (`value` is the micro-batch).
    pub probes: Vec<Probe>,
}

/// The largest micro-batch for which the file's batch (`dim`'s value) fits `budget` with
/// gradient accumulation: the divisors of the batch are compiled from the largest down, each
/// accumulating `batch / divisor` micro-steps, and the first that fits is returned (the
/// larger divisors compiled before it do not fit). `on_probe` sees every compile.
///
/// Errors: as [`fit_dim`]; [`FitError::Infeasible`] when micro-batch 1 does not fit.
pub fn fit_accumulation(
    source: &str,
    options: &Options,
    dim: &str,
    budget: u64,
    on_probe: &mut dyn FnMut(&Probe),
) -> Result<AccumulationFit, FitError> {
    let batch = start_value(source, options, dim)?;
    let mut search = Search::new(source, options, (dim, budget), on_probe, Some(batch));
    let mut next = None;
    for micro in divisors_descending(batch) {
        let (plan, probe) = search.probe(micro)?;
        if probe.fits {
            return Ok(AccumulationFit {
                dim: dim.to_string(),
                batch,
                micro_batch: micro,
                accumulate: (batch / micro) as u32,
                arena_bytes: probe.arena_bytes,
                next,
                budget,
                plan,
                probes: search.probes,
            });
        }
        if micro == 1 {
            return Err(search.infeasible(plan, probe));
        }
        next = Some(probe);
    }
    Err(FitError::Compile {
        value: batch,
        error: CompileError::Internal(vec![format!("{dim}={batch} has no divisor")]),
    })
}

/// The divisors of `n` (positive) from the largest down whose quotient fits a `u32`.
fn divisors_descending(n: i64) -> Vec<i64> {
    let mut small = Vec::new();
    let mut large = Vec::new();
    let mut d = 1;
    while d * d <= n {
        if n % d == 0 {
            small.push(d);
            if d * d != n {
                large.push(n / d);
            }
        }
        d += 1;
    }
    large
        .into_iter()
        .chain(small.into_iter().rev())
        .filter(|&d| u32::try_from(n / d).is_ok())
        .collect()
}

/// Why [`fit_dim`] found no value.
#[derive(Debug, Clone)]
pub enum FitError {
    /// The model declares no dim of that name.
    UnknownDim {
        /// The requested dim.
        dim: String,
        /// The dims the model does declare.
        known: Vec<String>,
    },
    /// A compile failed (the file itself, or the model at one probed value).
    Compile {
        /// The dim's value in the failing compile.
        value: i64,
        /// What failed.
        error: CompileError,
    },
    /// Even value 1 does not fit: `bytes` is the report at 1.
    Infeasible {
        /// The dim searched.
        dim: String,
        /// The smallest value searched (1, or the multiple the search steps by).
        value: i64,
        /// The arena at `value`.
        arena_bytes: u64,
        /// The budget.
        budget: u64,
        /// The byte accounting of the plan at `value`.
        bytes: Box<Bytes>,
    },
    /// The plan still fits at [`MAX_FIT_VALUE`]: the dim does not bound memory.
    Unbounded {
        /// The dim searched.
        dim: String,
        /// The largest value probed.
        value: i64,
        /// The arena at that value.
        arena_bytes: u64,
    },
}

impl fmt::Display for FitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use crate::plan::human_bytes;
        match self {
            FitError::UnknownDim { dim, known } => write!(
                f,
                "the model has no dim `{dim}` (its dims are: {})",
                known.join(", ")
            ),
            FitError::Compile { value, error } => match error {
                CompileError::User(u) => write!(f, "at value {value}: {} ({})", u.message, u.help),
                CompileError::Internal(errs) => {
                    write!(f, "at value {value}: internal error: {}", errs.join("; "))
                }
            },
            FitError::Infeasible {
                dim,
                value,
                arena_bytes,
                budget,
                bytes,
            } => {
                let (name, part) = bytes.dominant_part();
                write!(
                    f,
                    "nothing fits: even {dim}={value} needs an arena of {} ({arena_bytes} bytes) but the budget is {} ({budget} bytes); {name} dominate{} at {} ({part} bytes)",
                    human_bytes(*arena_bytes),
                    human_bytes(*budget),
                    if name.ends_with('s') { "" } else { "s" },
                    human_bytes(part),
                )
            }
            FitError::Unbounded {
                dim,
                value,
                arena_bytes,
            } => write!(
                f,
                "{dim}={value} still fits (arena {}): the dim does not bound the step's memory",
                human_bytes(*arena_bytes)
            ),
        }
    }
}

/// The largest value of `dim` for which `compile(source, options)` with `dim` overridden
/// yields a plan whose arena is at most `budget` bytes.
///
/// The search starts at the dim's value in the file (or in `options.overrides`, if it is
/// set there): if that fits it doubles until a value does not, otherwise it checks 1; then it
/// bisects between the largest fitting and the smallest non-fitting value compiled. Each
/// probe compiles with `budget` in place of `options.budget` (so the compiler may recompute
/// activations to fit where its checkpointing settings allow) and fits when it succeeds with an
/// arena of at most `budget` bytes; the returned plan records `budget` as its budget.
///
/// A probed value at which the model does not compile (a dim that must divide another)
/// counts as not fitting: the search goes on below it and the result names the refusal.
///
/// Errors: [`FitError::UnknownDim`], [`FitError::Compile`] when the file does not compile
/// at the value the search starts from (or at 1),
/// [`FitError::Infeasible`] when value 1 does not fit, [`FitError::Unbounded`].
pub fn fit_dim(
    source: &str,
    options: &Options,
    dim: &str,
    budget: u64,
) -> Result<FitResult, FitError> {
    fit_dim_with(source, options, (dim, 1), budget, &mut |_| {})
}

/// [`fit_dim`] over the multiples of `multiple_of` only (a dim that must stay aligned; 1
/// searches every value; the search starts at the largest multiple at most the file's value,
/// or at `multiple_of`), calling `on_probe` after each compile (for progress display).
///
/// When nothing fits and `options` leave everything on the device, the search runs again
/// with each of [`crate::OFFLOAD_KNOBS`] in host memory (the saved activations, the
/// optimizer state, both), and the answer with the largest value is returned (of equal
/// values, the one with the least estimated step time on the `--gpu`, the H100 without
/// one), if any finds one (its plan says so); offload costs step time, so it is never
/// taken when any value fits without it.
pub fn fit_dim_with(
    source: &str,
    options: &Options,
    (dim, multiple_of): (&str, i64),
    budget: u64,
    on_probe: &mut dyn FnMut(&Probe),
) -> Result<FitResult, FitError> {
    let plain = search_dim(source, options, (dim, multiple_of), budget, on_probe);
    if !matches!(plain, Err(FitError::Infeasible { .. })) || options.offload.is_some() {
        return plain;
    }
    let gpu = options.gpu.unwrap_or_default();
    let mut best: Option<(FitResult, f64)> = None;
    for knob in crate::OFFLOAD_KNOBS {
        let offloaded = Options {
            offload: Some(knob),
            ..options.clone()
        };
        let search = (dim, multiple_of);
        let Ok(found) = search_dim(source, &offloaded, search, budget, on_probe) else {
            continue;
        };
        let seconds = crate::cost::estimate(found.plan.plan(), gpu).seconds;
        let better = best
            .as_ref()
            .is_none_or(|(b, t)| found.value > b.value || (found.value == b.value && seconds < *t));
        if better {
            best = Some((found, seconds));
        }
    }
    match best {
        Some((found, _)) => Ok(found),
        None => plain,
    }
}

/// The search of [`fit_dim_with`] under `options` as they are.
fn search_dim(
    source: &str,
    options: &Options,
    (dim, multiple_of): (&str, i64),
    budget: u64,
    on_probe: &mut dyn FnMut(&Probe),
) -> Result<FitResult, FitError> {
    let step = multiple_of.max(1);
    let start = start_value(source, options, dim)?;
    let mut search = Search::new(source, options, (dim, budget), on_probe, None);
    // Values are k * step; the search runs over k.
    let at = |k: i64| k.saturating_mul(step);
    let (first_k, top_k) = ((start / step).max(1), (MAX_FIT_VALUE / step).max(1));
    // Invariant once found: `lo` fits, `hi` does not, lo < hi.
    let first = search.probe(at(first_k))?;
    let (mut lo, mut hi) = if first.1.fits {
        let mut lo = (first_k, first.0);
        loop {
            if lo.0 >= top_k {
                return Err(FitError::Unbounded {
                    dim: dim.to_string(),
                    value: at(lo.0),
                    arena_bytes: lo.1.plan().arena_bytes,
                });
            }
            let next = lo.0.saturating_mul(2).min(top_k);
            match search.probe_or_refused(at(next))? {
                Ok((plan, p)) if p.fits => lo = (next, plan),
                Ok((_, p)) | Err(p) => break (lo, (next, p)),
            }
        }
    } else if first_k == 1 {
        return Err(search.infeasible(first.0, first.1));
    } else {
        let one = search.probe(at(1))?;
        if !one.1.fits {
            return Err(search.infeasible(one.0, one.1));
        }
        ((1, one.0), (first_k, first.1))
    };
    while hi.0 - lo.0 > 1 {
        let mid = lo.0 + (hi.0 - lo.0) / 2;
        match search.probe_or_refused(at(mid))? {
            Ok((plan, p)) if p.fits => lo = (mid, plan),
            Ok((_, p)) | Err(p) => hi = (mid, p),
        }
    }
    let plan = lo.1;
    Ok(FitResult {
        dim: dim.to_string(),
        value: at(lo.0),
        arena_bytes: plan.plan().arena_bytes,
        next_value: at(hi.0),
        next_arena_bytes: hi.1.arena_bytes,
        next_without_budget: hi.1.without_budget,
        next_refusal: search.refusals.remove(&at(hi.0)),
        budget,
        start,
        plan,
        probes: search.probes,
    })
}

/// The dim's value before the search: its override in `options`, else the file's value.
fn start_value(source: &str, options: &Options, dim: &str) -> Result<i64, FitError> {
    let fail = |e: crate::diagnostic::UserError| FitError::Compile {
        value: 0,
        error: CompileError::User(e),
    };
    let ast = crate::front::parse(source).map_err(fail)?;
    let module = crate::front::lower(&ast, &options.overrides).map_err(|e| {
        let value = options
            .overrides
            .iter()
            .find(|(n, _)| n == dim)
            .map_or(0, |&(_, v)| v);
        FitError::Compile {
            value,
            error: CompileError::User(e),
        }
    })?;
    module
        .dims
        .iter()
        .find(|(n, _)| n == dim)
        .map(|&(_, v)| v.max(1))
        .ok_or_else(|| FitError::UnknownDim {
            dim: dim.to_string(),
            known: module.dims.iter().map(|(n, _)| n.clone()).collect(),
        })
}

struct Search<'a> {
    source: &'a str,
    options: &'a Options,
    dim: &'a str,
    budget: u64,
    probes: Vec<Probe>,
    on_probe: &'a mut dyn FnMut(&Probe),
    /// With gradient accumulation: the batch each probed micro-batch accumulates to.
    accumulate_to: Option<i64>,
    /// Why each refused value (see [`Search::probe_or_refused`]) does not compile.
    refusals: std::collections::BTreeMap<i64, String>,
}

impl<'a> Search<'a> {
    /// A search over `dim` against `budget`, with gradient accumulation to `accumulate_to`
    /// when given.
    fn new(
        source: &'a str,
        options: &'a Options,
        (dim, budget): (&'a str, u64),
        on_probe: &'a mut dyn FnMut(&Probe),
        accumulate_to: Option<i64>,
    ) -> Search<'a> {
        Search {
            source,
            options,
            dim,
            budget,
            probes: Vec::new(),
            on_probe,
            accumulate_to,
            refusals: std::collections::BTreeMap::new(),
        }
    }

    /// Compiles at `value` and records the probe.
    ///
    /// The compile gets `budget` as its budget, so it may recompute (checkpoint) to fit.
    /// When it fails with a user error, the model is compiled once more without a budget:
    /// if that succeeds the failure was the budget and the value does not fit (its arena is
    /// the one without fitting); otherwise the value does not compile at all.
    fn probe(&mut self, value: i64) -> Result<(VerifiedPlan, Probe), FitError> {
        let mut opts = self.options.clone();
        opts.overrides.retain(|(n, _)| n != self.dim);
        opts.overrides.push((self.dim.to_string(), value));
        opts.budget = Some(self.budget);
        if let Some(batch) = self.accumulate_to {
            opts.accumulate = Some((batch / value.max(1)) as u32);
        }
        let mut without_budget = false;
        let plan = match compile(self.source, &opts) {
            Ok(c) => c.plan,
            Err(CompileError::User(first)) => {
                opts.budget = Some(u64::MAX);
                match compile(self.source, &opts) {
                    Ok(c) if c.plan.plan().report.budgeted_bytes() > self.budget => {
                        without_budget = true;
                        c.plan
                    }
                    Ok(_) | Err(_) => {
                        return Err(FitError::Compile {
                            value,
                            error: CompileError::User(first),
                        })
                    }
                }
            }
            Err(error) => return Err(FitError::Compile { value, error }),
        };
        let arena_bytes = plan.plan().arena_bytes;
        let p = Probe {
            value,
            arena_bytes,
            fits: plan.plan().report.budgeted_bytes() <= self.budget,
            without_budget,
            refused: false,
        };
        self.probes.push(p);
        (self.on_probe)(&p);
        Ok((plan, p))
    }

    /// [`Search::probe`], but a value at which the model does not compile for a user error
    /// (a dim that must divide another, say) is a refused probe, recorded with its reason,
    /// instead of the search's end: the search goes on below it.
    fn probe_or_refused(
        &mut self,
        value: i64,
    ) -> Result<Result<(VerifiedPlan, Probe), Probe>, FitError> {
        match self.probe(value) {
            Ok(found) => Ok(Ok(found)),
            Err(FitError::Compile {
                error: CompileError::User(why),
                ..
            }) => {
                let p = Probe {
                    value,
                    arena_bytes: 0,
                    fits: false,
                    without_budget: false,
                    refused: true,
                };
                self.refusals.insert(value, why.message);
                self.probes.push(p);
                (self.on_probe)(&p);
                Ok(Err(p))
            }
            Err(e) => Err(e),
        }
    }

    fn infeasible(&self, plan: VerifiedPlan, p: Probe) -> FitError {
        FitError::Infeasible {
            dim: self.dim.to_string(),
            value: p.value,
            arena_bytes: p.arena_bytes,
            budget: self.budget,
            bytes: Box::new(plan.plan().report.bytes.clone()),
        }
    }
}
