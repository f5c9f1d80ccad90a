//! Greedy layouts: first-fit (the baseline) and XLA-style global best-fit over several orderings.

use super::bound::section_totals;
use super::problem::Problem;
use super::BufferRequest;

/// How a free gap is chosen for the next buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fit {
    /// Lowest gap that fits.
    First,
    /// Smallest gap that fits (lowest on ties); on top of everything when none fits.
    Best,
}

/// Plain first-fit in order of start time (ties by request index): each buffer goes to the
/// lowest aligned offset that is free over its whole lifetime. Returns one offset per request,
/// each a multiple of `alignment` (0 counts as 1); zero-size buffers get 0. The result always
/// passes [`super::validate`] with its own size as the arena.
pub fn first_fit(requests: &[BufferRequest], alignment: u64) -> Vec<u64> {
    let problem = Problem::new(requests, alignment);
    let mut order: Vec<u32> = (0..problem.len() as u32).collect();
    order.sort_by_key(|&i| (problem.items[i as usize].start, i));
    problem.expand(&place_in_order(&problem, &order, Fit::First))
}

/// Best-fit over several static orderings, tried in turn until one gives at most `enough`
/// bytes (a proven lower bound: nothing smaller exists); returns the smallest layout
/// (earliest ordering on ties), indexed like `problem.items`.
pub(crate) fn best_of_orderings(problem: &Problem, enough: u64) -> Vec<u64> {
    let mut best: Option<(u64, Vec<u64>)> = None;
    for order in orderings(problem) {
        let offsets = place_in_order(problem, &order, Fit::Best);
        let size = problem.layout_size(&offsets);
        if best.as_ref().is_none_or(|(b, _)| size < *b) {
            best = Some((size, offsets));
        }
        if size <= enough {
            break;
        }
    }
    best.map(|(_, o)| o).unwrap_or_default()
}

/// A static ordering of items: keys compared descending, ties by index.
#[derive(Debug, Clone, Copy)]
enum Order {
    /// Size, then duration.
    Size,
    /// Size x duration, then size.
    Area,
    /// Largest live total over the item's lifetime, then area (MiniMalloc's "total" order).
    PeakTotal,
    /// Start time ascending, then size.
    Start,
}

/// The static orderings tried by the heuristic, each sorted when it is reached.
fn orderings(problem: &Problem) -> impl Iterator<Item = Vec<u32>> + '_ {
    let peak = peak_totals(problem);
    let key = move |order: Order, i: usize| -> (u128, u128) {
        let it = problem.items[i];
        match order {
            Order::Size => (u128::from(it.size), u128::from(it.duration())),
            Order::Area => (area(problem, i), u128::from(it.size)),
            Order::PeakTotal => (u128::from(peak[i]), area(problem, i)),
            Order::Start => (u128::from(u64::MAX - it.start), u128::from(it.size)),
        }
    };
    [Order::PeakTotal, Order::Size, Order::Area, Order::Start]
        .into_iter()
        .map(move |kind| {
            let mut order: Vec<u32> = (0..problem.len() as u32).collect();
            order.sort_by_cached_key(|&i| std::cmp::Reverse(key(kind, i as usize)));
            order
        })
}

/// Size times duration of item `i`.
pub(crate) fn area(problem: &Problem, i: usize) -> u128 {
    let it = problem.items[i];
    u128::from(it.size) * u128::from(it.duration())
}

/// For each item, the largest section total (live bytes) over the sections it spans, by a
/// sparse table of range maxima: O(s log s + n) for s sections and n items.
pub(crate) fn peak_totals(problem: &Problem) -> Vec<u64> {
    let mut levels = vec![section_totals(problem)];
    let mut width = 1;
    while 2 * width <= problem.sections {
        let below = &levels[levels.len() - 1];
        let level = (0..below.len() - width)
            .map(|s| below[s].max(below[s + width]))
            .collect();
        levels.push(level);
        width *= 2;
    }
    problem
        .items
        .iter()
        .map(|it| {
            let (first, last) = (it.first as usize, it.last as usize);
            let level = (last - first).ilog2() as usize;
            let table = &levels[level];
            table[first].max(table[last - (1 << level)])
        })
        .collect()
}

/// Places items one by one in `order`, each into a gap chosen by `fit` among the already placed
/// items it conflicts with. Returns offsets indexed like `problem.items`.
fn place_in_order(problem: &Problem, order: &[u32], fit: Fit) -> Vec<u64> {
    let mut offsets = vec![0u64; problem.len()];
    let mut placed = vec![false; problem.len()];
    let mut busy: Vec<(u64, u64)> = Vec::new();
    for &i in order {
        let i = i as usize;
        busy.clear();
        busy.extend(
            problem
                .neighbors(i)
                .iter()
                .map(|&j| j as usize)
                .filter(|&j| placed[j])
                .map(|j| (offsets[j], offsets[j] + problem.items[j].size)),
        );
        busy.sort_unstable_by_key(|&(lo, _)| lo);
        offsets[i] = choose_gap(problem, &busy, problem.items[i].size, fit);
        placed[i] = true;
    }
    offsets
}

/// Picks an aligned offset for `size` bytes given the busy byte ranges sorted by start.
fn choose_gap(problem: &Problem, busy: &[(u64, u64)], size: u64, fit: Fit) -> u64 {
    let mut cursor = 0u64;
    let mut best: Option<(u64, u64)> = None; // (gap length, offset)
    for &(lo, hi) in busy {
        let at = problem.align_up(cursor);
        if lo.saturating_sub(at) >= size {
            let gap = lo - at;
            if fit == Fit::First {
                return at;
            }
            if best.is_none_or(|(g, _)| gap < g) {
                best = Some((gap, at));
            }
        }
        cursor = cursor.max(hi);
    }
    best.map_or_else(|| problem.align_up(cursor), |(_, at)| at)
}
