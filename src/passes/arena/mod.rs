//! Arena layout: places every buffer at a fixed byte offset in one arena (dynamic storage allocation).
//!
//! The pipeline is: [`lower_bound`] (a proven bound), a fast multi-ordering best-fit heuristic,
//! then a deterministic MiniMalloc-style branch-and-bound search over canonical solutions that
//! tries to close the gap to the bound (or reach the requested capacity) within a node budget.
//! [`validate`] is an independent checker for any layout.

mod bound;
mod flat;
mod heuristic;
mod node_budget;
mod problem;
mod search;
mod spanning;
mod sweep;
mod validate;

use std::time::{Duration, Instant};

pub use bound::lower_bound;
pub use heuristic::first_fit;
pub use validate::{validate, LayoutViolation};

use node_budget::SearchBudget;
use problem::Problem;
use search::Outcome;

/// One buffer to place: `size` bytes, live over the half-open step interval [start, end).
/// Two buffers conflict iff their intervals intersect (a.start < b.end && b.start < a.end).
/// Zero-size buffers (and buffers with `start >= end`) never conflict with anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferRequest {
    /// Size in bytes.
    pub size: u64,
    /// First step at which the buffer is live.
    pub start: u64,
    /// First step at which the buffer is dead again (exclusive).
    pub end: u64,
}

impl BufferRequest {
    /// True iff both buffers are non-empty and their live intervals intersect.
    pub fn conflicts(&self, other: &BufferRequest) -> bool {
        self.is_live() && other.is_live() && self.start < other.end && other.start < self.end
    }

    /// True iff the buffer occupies bytes for a non-empty interval.
    pub fn is_live(&self) -> bool {
        self.size > 0 && self.start < self.end
    }
}

/// Knobs for [`layout`].
#[derive(Debug, Clone)]
pub struct LayoutOptions {
    /// Every offset is a multiple of this (power of two; 1 for CSV instances, 256 in plans).
    /// Zero is treated as 1.
    pub alignment: u64,
    /// Wall-clock cap for the exact/anytime search after the heuristic. It also sets the
    /// deterministic node budget ([`node_budget`]).
    pub time_limit: std::time::Duration,
    /// Stop searching as soon as a layout of at most this many bytes is found.
    pub capacity: Option<u64>,
}

impl Default for LayoutOptions {
    fn default() -> Self {
        LayoutOptions {
            alignment: 1,
            time_limit: Duration::from_secs(1),
            capacity: None,
        }
    }
}

/// Result of [`layout`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// One offset per request, same order; each a multiple of the alignment.
    pub offsets: Vec<u64>,
    /// max(offset + size) over buffers (0 if none).
    pub size: u64,
    /// Proven lower bound on any valid layout's size (at least [`lower_bound`]; higher when
    /// the search proved smaller sizes infeasible).
    pub lower_bound: u64,
    /// Size found by the heuristic alone.
    pub heuristic_size: u64,
    /// `size == lower_bound`, or the search proved optimality.
    pub optimal: bool,
}

/// Search nodes granted per millisecond of `time_limit`, for a problem of `n` live buffers:
/// `NODE_RATE / (n + 16)`, at least 1 (a node costs time roughly linear in `n`). The node
/// budget, not the clock, bounds the search, so the result is a pure function of the input
/// whenever the search spends its budget before the wall-clock cap `time_limit`; the budget
/// is calibrated to between a quarter and 60% of the node rate measured on the MiniMalloc
/// benchmark instances on a shared 2-core 2024 server (measured rates correspond to a
/// `NODE_RATE` of about 90k to 210k; a node is one search call, the branches it rejects by
/// inference are not counted), so the cap only cuts in on a machine (or under a load) more than about 1.7x slower.
pub const NODE_RATE: u64 = 50_000;

/// The deterministic node budget for `n` live buffers and `time_limit`.
pub fn node_budget(n: usize, time_limit: Duration) -> u64 {
    let per_ms = (NODE_RATE / (n as u64 + 16)).max(1);
    u64::try_from(time_limit.as_millis())
        .unwrap_or(u64::MAX)
        .saturating_mul(per_ms)
}

/// Lays out `requests` in one arena.
///
/// Guarantees: the result always passes [`validate`] with `arena_size = size`; `size` is never
/// worse than the heuristic's; `lower_bound <= size`; deterministic (same input and options give
/// the same output) whenever the search ends within its node budget before the wall-clock cap.
/// Zero-size buffers get offset 0.
pub fn layout(requests: &[BufferRequest], options: &LayoutOptions) -> Layout {
    spanning::stacked_below(requests, options, layout_all)
}

/// Above this many pairs of buffers live at once, listing the conflicts would dominate the
/// compile (a deep training step's saved activations overlap everything between their forward
/// and backward use, so the pairs grow with the square of the depth): the layout is then the
/// placement in time order alone, without the orderings and the search.
pub const CONFLICT_PAIR_LIMIT: u64 = 1 << 24;

/// [`layout`] of every request: placed in time order (O(n log n)), which ends it when that
/// reaches the lower bound or when the conflict pairs pass [`CONFLICT_PAIR_LIMIT`]; else the
/// best of that and the heuristic's orderings, then the search.
fn layout_all(requests: &[BufferRequest], options: &LayoutOptions) -> Layout {
    let alignment = options.alignment.max(1);
    let bound = lower_bound(requests, alignment);
    let in_time_order = sweep::layout_in_time_order(requests, alignment);
    let time_order_size = sweep::extent(requests, &in_time_order);
    if time_order_size <= bound || sweep::conflict_pairs(requests) > CONFLICT_PAIR_LIMIT {
        return Layout {
            offsets: in_time_order,
            size: time_order_size,
            lower_bound: bound.min(time_order_size),
            heuristic_size: time_order_size,
            optimal: time_order_size <= bound,
        };
    }
    let problem = Problem::new(requests, alignment);
    let mut heuristic = heuristic::best_of_orderings(&problem, bound);
    let mut heuristic_size = problem.layout_size(&heuristic);
    if time_order_size < heuristic_size {
        heuristic = problem.origin.iter().map(|&i| in_time_order[i]).collect();
        heuristic_size = time_order_size;
    }
    let mut state = Anytime {
        best: heuristic,
        best_size: heuristic_size,
        lower: bound.min(heuristic_size),
    };
    let target = options.capacity.map_or(state.lower, |c| c.max(state.lower));
    if state.best_size > target {
        let deadline = Instant::now() + options.time_limit;
        let nodes = node_budget(problem.len(), options.time_limit);
        let mut budget = SearchBudget::new(nodes, deadline);
        state.improve(&problem, target, options.capacity.is_some(), &mut budget);
    }
    Layout {
        offsets: problem.expand(&state.best),
        size: state.best_size,
        lower_bound: state.lower,
        heuristic_size,
        optimal: state.best_size <= state.lower,
    }
}

/// Best layout so far and the proven lower bound, refined by decision probes.
struct Anytime {
    best: Vec<u64>,
    best_size: u64,
    lower: u64,
}

impl Anytime {
    /// Probes `target` first, then bisects between the bound and the best size until the
    /// gap closes, the target is met, or the budget runs out. A probe that runs out of its
    /// share moves the next probe halfway towards the best size (an easier question). With a
    /// `given` capacity the first probe (at that capacity) may spend the whole budget.
    fn improve(&mut self, problem: &Problem, target: u64, given: bool, budget: &mut SearchBudget) {
        let mut cap = target;
        let mut first = given;
        while self.best_size > target.max(self.lower) && !budget.exhausted() {
            let share = if std::mem::take(&mut first) {
                budget.remaining()
            } else {
                budget.remaining() / 2 + 1
            };
            let unknown = match search::solve(problem, cap, budget, share) {
                Outcome::Found(offsets) => {
                    self.best_size = problem.layout_size(&offsets);
                    self.best = offsets;
                    false
                }
                Outcome::Infeasible => {
                    self.lower = self.lower.max(cap.saturating_add(1));
                    false
                }
                Outcome::Unknown => true,
            };
            if self.best_size <= target.max(self.lower) {
                break;
            }
            let last_try = self.best_size - 1;
            if unknown && cap >= last_try {
                break;
            }
            let from = if unknown { cap } else { self.lower };
            cap = from + (last_try - from) / 2;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Small deterministic xorshift generator (no extra crates).
    pub(crate) struct Rng(u64);

    impl Rng {
        pub(crate) fn new(seed: u64) -> Rng {
            Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
        }

        pub(crate) fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n.max(1)
        }
    }

    /// `n` random buffers over `horizon` steps with sizes below `max_size` (some zero-size).
    pub(crate) fn random_instance(
        rng: &mut Rng,
        n: usize,
        horizon: u64,
        max_size: u64,
    ) -> Vec<BufferRequest> {
        (0..n)
            .map(|_| {
                let start = rng.below(horizon);
                let end = start + 1 + rng.below(horizon - start);
                let size = if rng.below(20) == 0 {
                    0
                } else {
                    1 + rng.below(max_size)
                };
                BufferRequest { size, start, end }
            })
            .collect()
    }

    /// `rounds` random instances from `seed`, each with its round number and alignment: 1 to
    /// `max_n` buffers over `horizon` steps with sizes below `max_size` (as
    /// [`random_instance`]), the alignment cycling through `alignments`.
    pub(crate) fn random_rounds(
        seed: u64,
        rounds: usize,
        max_n: u64,
        alignments: [u64; 3],
        (horizon, max_size): (u64, u64),
    ) -> Vec<(usize, u64, Vec<BufferRequest>)> {
        let mut rng = Rng::new(seed);
        (0..rounds)
            .map(|round| {
                let n = 1 + rng.below(max_n) as usize;
                let reqs = random_instance(&mut rng, n, horizon, max_size);
                (round, alignments[round % 3], reqs)
            })
            .collect()
    }

    fn options(alignment: u64, ms: u64) -> LayoutOptions {
        LayoutOptions {
            alignment,
            time_limit: Duration::from_millis(ms),
            capacity: None,
        }
    }

    /// Lowest aligned offset where `r` fits next to the `placed` buffers.
    fn lowest_fit(placed: &[(BufferRequest, u64)], r: &BufferRequest, alignment: u64) -> u64 {
        let mut offset = 0;
        loop {
            let clash = placed
                .iter()
                .find(|(p, o)| p.conflicts(r) && *o < offset + r.size && offset < *o + p.size);
            match clash {
                Some((p, o)) => offset = (o + p.size).div_ceil(alignment) * alignment,
                None => return offset,
            }
        }
    }

    /// Optimum by brute force: the best first-fit over all permutations (first-fit in the
    /// offset order of any layout never places a buffer higher than that layout does).
    pub(crate) fn brute_force(requests: &[BufferRequest], alignment: u64) -> u64 {
        fn go(
            reqs: &[BufferRequest],
            used: &mut Vec<bool>,
            placed: &mut Vec<(BufferRequest, u64)>,
            a: u64,
            best: &mut u64,
        ) {
            let height = placed.iter().map(|(p, o)| o + p.size).max().unwrap_or(0);
            if height >= *best {
                return;
            }
            if placed.len() == reqs.len() {
                *best = height;
                return;
            }
            for i in 0..reqs.len() {
                if !used[i] {
                    used[i] = true;
                    let o = if reqs[i].is_live() {
                        lowest_fit(placed, &reqs[i], a)
                    } else {
                        0
                    };
                    placed.push((reqs[i], o));
                    go(reqs, used, placed, a, best);
                    placed.pop();
                    used[i] = false;
                }
            }
        }
        let mut best = u64::MAX;
        go(
            requests,
            &mut vec![false; requests.len()],
            &mut Vec::new(),
            alignment,
            &mut best,
        );
        best
    }

    #[test]
    fn random_layouts_are_valid_and_bounded() {
        for (round, alignment, reqs) in random_rounds(7, 150, 60, [1, 4, 16], (30, 100)) {
            let result = layout(&reqs, &options(alignment, 5));
            assert_eq!(
                validate(&reqs, &result.offsets, result.size, alignment),
                Ok(())
            );
            assert!(result.size >= result.lower_bound, "{round}: {result:?}");
            assert!(result.lower_bound >= lower_bound(&reqs, alignment));
            assert!(result.size <= result.heuristic_size);
            let ff = first_fit(&reqs, alignment);
            let ff_size = reqs
                .iter()
                .zip(&ff)
                .map(|(r, o)| o + r.size)
                .max()
                .unwrap_or(0);
            assert_eq!(validate(&reqs, &ff, ff_size, alignment), Ok(()));
            assert!(ff_size >= result.lower_bound);
        }
    }

    #[test]
    fn small_instances_are_optimal() {
        for (round, alignment, reqs) in random_rounds(11, 300, 7, [1, 2, 4], (8, 9)) {
            let result = layout(&reqs, &options(alignment, 200));
            let optimum = brute_force(&reqs, alignment);
            assert_eq!(result.size, optimum, "{round}: {reqs:?} {result:?}");
            assert!(result.optimal, "{round}: {reqs:?} {result:?}");
            assert!(result.lower_bound <= optimum);
        }
    }

    #[test]
    fn layout_is_deterministic() {
        let mut rng = Rng::new(3);
        let reqs = random_instance(&mut rng, 60, 40, 1000);
        let a = layout(&reqs, &options(8, 20));
        let b = layout(&reqs, &options(8, 20));
        assert_eq!(a, b);
    }

    #[test]
    fn capacity_stops_search_and_empty_input_works() {
        let reqs = [
            BufferRequest {
                size: 4,
                start: 0,
                end: 3,
            },
            BufferRequest {
                size: 4,
                start: 3,
                end: 9,
            },
            BufferRequest {
                size: 4,
                start: 0,
                end: 9,
            },
            BufferRequest {
                size: 4,
                start: 9,
                end: 21,
            },
            BufferRequest {
                size: 4,
                start: 0,
                end: 21,
            },
            BufferRequest {
                size: 0,
                start: 0,
                end: 21,
            },
        ];
        let result = layout(
            &reqs,
            &LayoutOptions {
                capacity: Some(12),
                ..options(1, 100)
            },
        );
        assert_eq!(result.size, 12);
        assert!(result.optimal);
        assert_eq!(result.offsets[5], 0);
        let empty = layout(&[], &options(256, 10));
        assert_eq!(
            empty,
            Layout {
                offsets: vec![],
                size: 0,
                lower_bound: 0,
                heuristic_size: 0,
                optimal: true
            }
        );
    }

    #[test]
    fn lower_bound_accounts_for_alignment() {
        let reqs = [
            BufferRequest {
                size: 100,
                start: 0,
                end: 2,
            },
            BufferRequest {
                size: 100,
                start: 1,
                end: 3,
            },
        ];
        assert_eq!(lower_bound(&reqs, 1), 200);
        assert_eq!(lower_bound(&reqs, 256), 356);
        assert_eq!(layout(&reqs, &options(256, 10)).size, 356);
    }
}
