//! Exact decision search over canonical layouts, following MiniMalloc (Moffitt, ASPLOS'23).
//!
//! The question is always "does every buffer fit below `cap`?". A layout is *canonical* when
//! the buffers can be placed one by one in non-decreasing offset order, each at its *minimum
//! offset* (the aligned top of the placed buffers it overlaps in time); gravity turns any layout
//! into a canonical one that is no larger. Each node of the depth-first search
//! * orders the unplaced buffers of its partition by (minimum offset, static preorder rank) and
//!   branches on each in turn, placing it at its minimum offset;
//! * *canonical only*: the next placement must come after the previous one in that order
//!   (offsets never decrease; at equal offsets ranks increase);
//! * *dominance*: a buffer whose minimum offset is at or above the lowest top any unplaced
//!   buffer could reach is skipped — that buffer would fit in the gap below, so the layout is
//!   met (with a smaller placement order) elsewhere in the tree;
//! * *section inference* after each placement: in every section (a maximal set of buffers live
//!   at one time), the floor (lowest minimum offset of its unplaced buffers, and at least the
//!   offset just placed) plus their total size must fit under `cap`; every lifted buffer must
//!   still fit on its own;
//! * *dynamic decomposition*: once no unplaced buffer spans a section boundary, both sides are
//!   independent sub-problems, solved one after the other with fresh preorders.
//!
//! Every rule keeps some layout within `cap` when one exists, so a search that finishes its tree
//! proves infeasibility. Node expansion is incremental: placements lift neighbours through a
//! trail that is unwound on backtrack, each section keeps its unplaced buffers in a compact
//! prefix (swap-to-end removal, undone by a count increment), and the candidate lists share one
//! stack, so a node allocates nothing unless it decomposes. The offset part of the section
//! test for the sections outside a candidate's own comes from per-node prefix/suffix maxima of
//! the section totals and runs before the candidate is placed (it rejects most candidates), and
//! the floor part is only redone in the sections a placement touched. Restarts cycle through MiniMalloc's
//! three preorders with doubling node limits.

use super::flat::Static;
use super::node_budget::SearchBudget;
use super::problem::Problem;

/// Result of one decision probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// A layout within the capacity, indexed like `problem.items`.
    Found(Vec<u64>),
    /// Proven: no layout fits in the capacity.
    Infeasible,
    /// The budget ran out first.
    Unknown,
}

/// Stack for the search thread (the recursion is one level per placed buffer).
const SEARCH_STACK_BYTES: usize = 512 << 20;

/// Looks for a layout of `problem` with every buffer ending at or below `cap`, spending at most
/// `share` nodes of `budget`. Restarts cycle through the [`PREORDERS`] with node limits that
/// start at twice the number of buffers and double after every full cycle (deterministic);
/// any restart that finishes its tree proves infeasibility. Returns [`Outcome::Unknown`] if the
/// search thread cannot be started.
pub(crate) fn solve(problem: &Problem, cap: u64, budget: &mut SearchBudget, share: u64) -> Outcome {
    if problem.items.iter().any(|it| it.size > cap) {
        return Outcome::Infeasible;
    }
    let layout = Static::new(problem);
    std::thread::scope(|scope| {
        let worker = std::thread::Builder::new()
            .name("arena-search".into())
            .stack_size(SEARCH_STACK_BYTES)
            .spawn_scoped(scope, || restarts(problem, &layout, cap, budget, share));
        match worker {
            Ok(handle) => handle.join().unwrap_or(Outcome::Unknown),
            Err(_) => Outcome::Unknown,
        }
    })
}

/// The restart loop of [`solve`].
fn restarts(
    problem: &Problem,
    st: &Static,
    cap: u64,
    budget: &mut SearchBudget,
    share: u64,
) -> Outcome {
    let mut left = share.min(budget.remaining());
    let mut limit = (2 * problem.len() as u64).max(64);
    let mut round = 0usize;
    while left > 0 {
        let preorder = PREORDERS[round % PREORDERS.len()];
        let before = budget.remaining();
        let mut solver = Solver::new(problem, st, cap, preorder, limit.min(left));
        let status = solver.solve_all(budget);
        left = left.saturating_sub(before - budget.remaining());
        match status {
            Status::Found => return Outcome::Found(solver.solution),
            Status::NotFound => return Outcome::Infeasible,
            Status::Aborted if budget.exhausted() => break,
            Status::Aborted => {}
        }
        round += 1;
        if round.is_multiple_of(PREORDERS.len()) {
            limit = limit.saturating_mul(2);
        }
    }
    Outcome::Unknown
}

/// One static preorder key, compared descending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    /// Lifetime length in steps.
    Width,
    /// Size times lifetime length.
    Area,
    /// Largest total of unplaced bytes over the buffer's sections.
    Total,
}

/// MiniMalloc's default preorders ("WAT", "TAW", "TWA"); ties by item index.
const PREORDERS: [[Key; 3]; 3] = [
    [Key::Width, Key::Area, Key::Total],
    [Key::Total, Key::Area, Key::Width],
    [Key::Total, Key::Width, Key::Area],
];

/// Result of a (sub)search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Found,
    NotFound,
    Aborted,
}

/// A set of unplaced items confined to sections `lo..hi`, independent of all others.
#[derive(Debug, Clone)]
struct Part {
    items: Vec<u32>,
    lo: u32,
    hi: u32,
}

/// What a placement changed, for [`Solver::check`].
#[derive(Debug, Clone, Copy)]
struct Placed {
    /// Sections whose floor or total may have changed (those of the placed item and of every
    /// lifted neighbour).
    touched: (u32, u32),
    /// The largest remaining total over the placed item's own sections.
    inside_peak: u64,
}

/// Search state for one capacity, one preorder and one node limit.
struct Solver<'p> {
    p: &'p Problem,
    st: &'p Static,
    cap: u64,
    preorder: [Key; 3],
    nodes: u64,
    /// Position of each item in its partition's preorder.
    rank: Vec<u32>,
    min_off: Vec<u64>,
    placed: Vec<bool>,
    /// Section lists whose first `sec_count[s]` entries are the unplaced items.
    sec_items: Vec<u32>,
    sec_count: Vec<u32>,
    slots: Vec<u32>,
    sec_total: Vec<u64>,
    cuts: Vec<u32>,
    /// Minimum offsets overwritten by placements: (item, old value).
    trail: Vec<(u32, u64)>,
    /// Stack of candidate lists: (minimum offset, rank, item).
    cands: Vec<(u64, u32, u32)>,
    /// Prefix and suffix maxima of the section totals over the current node's partition
    /// (`peaks[k]` = max of `lo..lo + k`, `peaks[stride + k]` = max of `lo + k..hi`).
    peaks: Vec<u64>,
    /// The node `peaks` was filled for (children overwrite it).
    peaks_node: u64,
    /// Nodes expanded by this solver (identifies nodes for `peaks_node`).
    expanded: u64,
    /// Offsets of the layout found (valid after `Status::Found`).
    solution: Vec<u64>,
}

impl<'p> Solver<'p> {
    fn new(p: &'p Problem, st: &'p Static, cap: u64, preorder: [Key; 3], nodes: u64) -> Self {
        let sec_count = st.sec_off.windows(2).map(|w| w[1] - w[0]).collect();
        Solver {
            p,
            st,
            cap,
            preorder,
            nodes,
            rank: vec![0; p.len()],
            min_off: vec![0; p.len()],
            placed: vec![false; p.len()],
            sec_items: st.sec_items.clone(),
            sec_count,
            slots: st.slots.clone(),
            sec_total: st.totals.clone(),
            cuts: st.cuts.clone(),
            trail: Vec::with_capacity(p.len()),
            cands: Vec::with_capacity(p.len()),
            peaks: vec![0; 2 * (p.sections + 1)],
            peaks_node: u64::MAX,
            expanded: 0,
            solution: vec![0; p.len()],
        }
    }

    /// Solves the whole problem, split at the boundaries no item spans.
    fn solve_all(&mut self, budget: &mut SearchBudget) -> Status {
        let root = Part {
            items: (0..self.p.len() as u32).collect(),
            lo: 0,
            hi: self.p.sections as u32,
        };
        let zero_cuts: Vec<u32> = (0..self.cuts.len() as u32)
            .filter(|&s| self.cuts[s as usize] == 0)
            .map(|s| s + 1)
            .collect();
        let pieces = self.split(&root, &zero_cuts);
        self.solve_pieces(&pieces, budget)
    }

    /// The non-empty pieces of the unplaced items of `part` between consecutive `cutpoints`
    /// (ascending, strictly inside `part.lo..part.hi`).
    fn split(&self, part: &Part, cutpoints: &[u32]) -> Vec<Part> {
        let mut bounds = Vec::with_capacity(cutpoints.len() + 2);
        bounds.push(part.lo);
        bounds.extend_from_slice(cutpoints);
        bounds.push(part.hi);
        let mut pieces: Vec<Part> = bounds
            .windows(2)
            .map(|w| Part {
                items: Vec::new(),
                lo: w[0],
                hi: w[1],
            })
            .collect();
        for &i in &part.items {
            if !self.placed[i as usize] {
                let first = self.st.first[i as usize];
                let k = bounds[1..].partition_point(|&b| b <= first);
                if let Some(piece) = pieces.get_mut(k) {
                    piece.items.push(i);
                }
            }
        }
        pieces.retain(|piece| !piece.items.is_empty());
        pieces
    }

    /// Solves independent pieces one after the other, each from a fresh canonical order.
    fn solve_pieces(&mut self, pieces: &[Part], budget: &mut SearchBudget) -> Status {
        for sub in pieces {
            let saved = self.rank_part(sub);
            let status = self.search(sub, (0, 0), budget);
            for (&i, r) in sub.items.iter().zip(saved) {
                self.rank[i as usize] = r;
            }
            if status != Status::Found {
                return status;
            }
        }
        Status::Found
    }

    /// The preorder key of item `i` (larger first), with current section totals.
    fn key(&self, i: usize) -> [u128; 3] {
        let it = self.p.items[i];
        let width = u128::from(it.duration());
        let total = self.sec_total[it.first as usize..it.last as usize]
            .iter()
            .copied()
            .max()
            .unwrap_or(0);
        self.preorder.map(|k| match k {
            Key::Width => width,
            Key::Area => width * u128::from(it.size),
            Key::Total => u128::from(total),
        })
    }

    /// Ranks the items of `part` by the preorder; returns their previous ranks.
    fn rank_part(&mut self, part: &Part) -> Vec<u32> {
        let keys: Vec<[u128; 3]> = part.items.iter().map(|&i| self.key(i as usize)).collect();
        let mut order: Vec<usize> = (0..part.items.len()).collect();
        order.sort_by(|&a, &b| {
            keys[b]
                .cmp(&keys[a])
                .then(part.items[a].cmp(&part.items[b]))
        });
        let saved = part.items.iter().map(|&i| self.rank[i as usize]).collect();
        for (pos, &k) in order.iter().enumerate() {
            self.rank[part.items[k] as usize] = pos as u32;
        }
        saved
    }

    /// Depth-first search over canonical placements of `part`; the next placement must come
    /// at or after `last` in (offset, rank) order.
    fn search(&mut self, part: &Part, last: (u64, u32), budget: &mut SearchBudget) -> Status {
        if self.nodes == 0 || !budget.take() {
            return Status::Aborted;
        }
        self.nodes -= 1;
        self.expanded += 1;
        let node = self.expanded;
        let mut min_height = u64::MAX;
        let mut any = false;
        for &i in &part.items {
            let i = i as usize;
            if !self.placed[i] {
                any = true;
                min_height = min_height.min(self.min_off[i] + self.st.size[i]);
            }
        }
        if !any {
            return Status::Found;
        }
        // Candidates go on a shared stack (children push above and truncate back).
        let start = self.cands.len();
        for &i in &part.items {
            let iu = i as usize;
            if self.placed[iu] {
                continue;
            }
            let key = (self.min_off[iu], self.rank[iu]);
            if key >= last && key.0 < min_height {
                self.cands.push((key.0, key.1, i));
            }
        }
        self.cands[start..].sort_unstable();
        let mut status = Status::NotFound;
        for k in start..self.cands.len() {
            let (offset, _, i) = self.cands[k];
            if self.peaks_node != node {
                self.fill_peaks(part);
                self.peaks_node = node;
            }
            // Most candidates fail the offset test on the sections outside their own; that
            // part needs no placement, so it runs first.
            if offset.saturating_add(self.outside_peak(part, i as usize)) > self.cap {
                continue;
            }
            status = self.branch(part, i as usize, budget);
            if status != Status::NotFound {
                break;
            }
        }
        self.cands.truncate(start);
        status
    }

    /// Places `i` at its minimum offset, searches below that, and takes the placement back.
    fn branch(&mut self, part: &Part, i: usize, budget: &mut SearchBudget) -> Status {
        let offset = self.min_off[i];
        let mark = self.trail.len();
        let placed = self.place(i);
        let status = if placed.is_some_and(|t| self.check(part, i, offset, t)) {
            self.solution[i] = offset;
            self.decompose(part, i, offset, budget)
        } else {
            Status::NotFound
        };
        self.unplace(i, mark);
        status
    }

    /// Continues in `part`, or in its independent pieces if placing `i` emptied a boundary.
    fn decompose(
        &mut self,
        part: &Part,
        i: usize,
        offset: u64,
        budget: &mut SearchBudget,
    ) -> Status {
        let boundaries = self.st.first[i] as usize..(self.st.last[i] as usize).saturating_sub(1);
        let mut split_at: Option<Vec<u32>> = None;
        for s in boundaries.clone() {
            self.cuts[s] -= 1;
            if self.cuts[s] == 0 {
                split_at.get_or_insert_with(Vec::new).push(s as u32 + 1);
            }
        }
        let status = match split_at {
            None => self.search(part, (offset, self.rank[i]), budget),
            Some(cutpoints) => {
                let pieces = self.split(part, &cutpoints);
                self.solve_pieces(&pieces, budget)
            }
        };
        for s in boundaries {
            self.cuts[s] += 1;
        }
        status
    }

    /// Marks `i` placed at its minimum offset, takes it out of its sections and lifts its
    /// unplaced neighbours. Returns what [`Solver::check`] needs, or `None` when some
    /// neighbour no longer fits under the capacity.
    fn place(&mut self, i: usize) -> Option<Placed> {
        self.placed[i] = true;
        let (first, last, size) = (self.st.first[i], self.st.last[i], self.st.size[i]);
        let mut inside_peak = 0;
        for s in first..last {
            self.remove_from_section(i, s);
            self.sec_total[s as usize] -= size;
            inside_peak = inside_peak.max(self.sec_total[s as usize]);
        }
        let top = self.p.align_up(self.min_off[i] + size);
        let mut touched = (first, last);
        for &j in self.p.neighbors(i) {
            let j = j as usize;
            if !self.placed[j] && self.min_off[j] < top {
                self.trail.push((j as u32, self.min_off[j]));
                self.min_off[j] = top;
                if top.saturating_add(self.st.size[j]) > self.cap {
                    return None;
                }
                touched.0 = touched.0.min(self.st.first[j]);
                touched.1 = touched.1.max(self.st.last[j]);
            }
        }
        Some(Placed {
            touched,
            inside_peak,
        })
    }

    /// Fills `peaks` for the section totals of `part`.
    fn fill_peaks(&mut self, part: &Part) {
        let (lo, hi) = (part.lo as usize, part.hi as usize);
        let stride = self.p.sections + 1;
        let mut run = 0;
        self.peaks[0] = 0;
        for (k, &t) in self.sec_total[lo..hi].iter().enumerate() {
            run = run.max(t);
            self.peaks[k + 1] = run;
        }
        run = 0;
        self.peaks[stride + hi - lo] = 0;
        for (k, &t) in self.sec_total[lo..hi].iter().enumerate().rev() {
            run = run.max(t);
            self.peaks[stride + k] = run;
        }
    }

    /// Swaps `i` to the end of section `s`'s unplaced prefix and shortens the prefix.
    fn remove_from_section(&mut self, i: usize, s: u32) {
        let st = self.st;
        let su = s as usize;
        let end = st.sec_off[su] + self.sec_count[su] - 1;
        let my_slot = (st.slot_base[i] + s - st.first[i]) as usize;
        let at = self.slots[my_slot];
        let other = self.sec_items[end as usize] as usize;
        let other_slot = (st.slot_base[other] + s - st.first[other]) as usize;
        self.sec_items.swap(at as usize, end as usize);
        self.slots[my_slot] = end;
        self.slots[other_slot] = at;
        self.sec_count[su] -= 1;
    }

    /// Takes back the placement of `i` (trail entries above `mark`). Section prefixes regrow
    /// by one: undo is strictly last-in first-out, so `i` sits just past each prefix.
    fn unplace(&mut self, i: usize, mark: usize) {
        while self.trail.len() > mark {
            if let Some((j, old)) = self.trail.pop() {
                self.min_off[j as usize] = old;
            }
        }
        let size = self.st.size[i];
        for s in self.st.first[i] as usize..self.st.last[i] as usize {
            self.sec_count[s] += 1;
            self.sec_total[s] += size;
        }
        self.placed[i] = false;
    }

    /// Section inference over `part` after placing `i` at `offset`: in every section with
    /// unplaced items, max(offset, their lowest minimum offset) plus their total bytes must
    /// fit under the capacity. The parent node passed the floor test everywhere, so it is only
    /// redone in the touched sections (each scan stops at the first item low enough); the
    /// offset test uses the node's `peaks` outside the sections of `i`.
    fn check(&self, part: &Part, i: usize, offset: u64, placed: Placed) -> bool {
        let peak = self.outside_peak(part, i).max(placed.inside_peak);
        if offset.saturating_add(peak) > self.cap {
            return false;
        }
        let from = placed.touched.0.max(part.lo) as usize;
        let to = placed.touched.1.min(part.hi) as usize;
        (from..to).all(|s| self.floor_fits(s))
    }

    /// The largest section total of `part` outside the sections of item `i`, from `peaks`.
    fn outside_peak(&self, part: &Part, i: usize) -> u64 {
        let stride = self.p.sections + 1;
        let first = (self.st.first[i] - part.lo) as usize;
        let last = (self.st.last[i] - part.lo) as usize;
        self.peaks[first].max(self.peaks[stride + last])
    }

    /// True when section `s` has no unplaced item, or one whose minimum offset leaves room
    /// for all their bytes below the capacity.
    fn floor_fits(&self, s: usize) -> bool {
        let count = self.sec_count[s] as usize;
        if count == 0 {
            return true;
        }
        let Some(threshold) = self.cap.checked_sub(self.sec_total[s]) else {
            return false;
        };
        let from = self.st.sec_off[s] as usize;
        self.sec_items[from..from + count]
            .iter()
            .any(|&j| self.min_off[j as usize] <= threshold)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{brute_force, random_rounds};
    use super::super::{validate, BufferRequest};
    use super::*;

    /// A probe with a generous budget.
    fn probe(problem: &Problem, cap: u64) -> Outcome {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut budget = SearchBudget::new(1 << 24, deadline);
        solve(problem, cap, &mut budget, u64::MAX)
    }

    #[test]
    fn decision_probes_match_brute_force() {
        for (round, alignment, reqs) in random_rounds(23, 250, 8, [1, 2, 4], (10, 9)) {
            let optimum = brute_force(&reqs, alignment);
            let problem = Problem::new(&reqs, alignment);
            match probe(&problem, optimum) {
                Outcome::Found(offsets) => {
                    let size = problem.layout_size(&offsets);
                    assert!(size <= optimum, "{round}: {reqs:?}");
                    let expanded = problem.expand(&offsets);
                    assert_eq!(validate(&reqs, &expanded, optimum, alignment), Ok(()));
                }
                other => unreachable!("{round}: {reqs:?} at {optimum}: {other:?}"),
            }
            if optimum > 0 {
                assert_eq!(
                    probe(&problem, optimum - 1),
                    Outcome::Infeasible,
                    "{round}: {reqs:?}"
                );
            }
        }
    }

    #[test]
    fn independent_groups_are_solved_separately() {
        // Two groups in time that no buffer joins, each needing 8 bytes (peak at steps 1-2).
        let mut reqs = Vec::new();
        for base in [0u64, 10] {
            for (size, start, end) in [(2, 0, 4), (4, 0, 2), (4, 2, 4), (2, 1, 3)] {
                reqs.push(BufferRequest {
                    size,
                    start: base + start,
                    end: base + end,
                });
            }
        }
        let problem = Problem::new(&reqs, 1);
        let found = probe(&problem, 8);
        let Outcome::Found(offsets) = found else {
            unreachable!("{found:?}")
        };
        assert_eq!(validate(&reqs, &problem.expand(&offsets), 8, 1), Ok(()));
        assert_eq!(probe(&problem, 7), Outcome::Infeasible);
    }
}
