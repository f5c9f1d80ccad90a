//! Exact search over canonical layouts, in the spirit of MiniMalloc (Moffitt, ASPLOS'23).
//!
//! A layout is *canonical* when every buffer sits at offset 0 or directly on top of a buffer it
//! overlaps in time; gravity turns any layout into a canonical one that is no larger. The search
//! places buffers in non-decreasing offset order (ties by a static rank), each at its minimum
//! feasible offset (the aligned top of the placed buffers it conflicts with), so it enumerates
//! every canonical layout. It prunes a partial layout when
//! * some unplaced buffer no longer fits under the capacity;
//! * *dominance*: the candidate's offset is at or above the top some other unplaced buffer
//!   would have at its own minimum offset (that buffer could drop into the gap below, giving a
//!   layout with a smaller offset sum, which the search meets elsewhere);
//! * *section inference*: in some section (elementary time interval) the lowest offset any
//!   unplaced buffer there can take, plus the bytes of all unplaced buffers there, exceeds the
//!   capacity.
//!
//! *Dynamic decomposition*: when no unplaced buffer spans a section boundary any more, the
//! buffers on either side are independent and are solved one after the other, each from a fresh
//! canonical order, with no backtracking between them.
//!
//! Every rule keeps some layout within capacity when one exists, so a search that finishes its
//! tree proves infeasibility. The search recurses once per placement; [`solve`] runs it on a
//! thread with a large stack.

use std::time::Instant;

use super::heuristic::area;
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

/// A deterministic node budget with a wall-clock safety cap.
#[derive(Debug, Clone)]
pub(crate) struct SearchBudget {
    nodes_left: u64,
    deadline: Instant,
    ticks: u32,
}

impl SearchBudget {
    /// `nodes` search nodes, but never past `deadline`.
    pub fn new(nodes: u64, deadline: Instant) -> SearchBudget {
        SearchBudget {
            nodes_left: nodes,
            deadline,
            ticks: 0,
        }
    }

    /// Nodes not yet spent.
    pub fn remaining(&self) -> u64 {
        self.nodes_left
    }

    /// True once no node is left (or the clock ran out).
    pub fn exhausted(&self) -> bool {
        self.nodes_left == 0
    }

    /// Spends one node; false when none is left. Reads the clock every 1024 nodes.
    fn take(&mut self) -> bool {
        if self.nodes_left == 0 {
            return false;
        }
        self.nodes_left -= 1;
        self.ticks = self.ticks.wrapping_add(1);
        if self.ticks.is_multiple_of(1024) && Instant::now() >= self.deadline {
            self.nodes_left = 0;
        }
        true
    }
}

/// Stack for the search thread (the recursion is one level per placed buffer).
const SEARCH_STACK_BYTES: usize = 512 << 20;

/// Looks for a layout of `problem` with every buffer ending at or below `cap`, spending at most
/// `share` nodes of `budget`. Restarts alternate between the [`PREORDERS`] with doubling
/// node limits, starting at the number of buffers (deterministic); any restart that finishes
/// its tree proves infeasibility. Returns [`Outcome::Unknown`] if the search thread cannot be
/// started.
pub(crate) fn solve(problem: &Problem, cap: u64, budget: &mut SearchBudget, share: u64) -> Outcome {
    if problem.items.iter().any(|it| it.size > cap) {
        return Outcome::Infeasible;
    }
    std::thread::scope(|scope| {
        let worker = std::thread::Builder::new()
            .name("arena-search".into())
            .stack_size(SEARCH_STACK_BYTES)
            .spawn_scoped(scope, || restarts(problem, cap, budget, share));
        match worker {
            Ok(handle) => handle.join().unwrap_or(Outcome::Unknown),
            Err(_) => Outcome::Unknown,
        }
    })
}

/// The restart loop of [`solve`].
fn restarts(problem: &Problem, cap: u64, budget: &mut SearchBudget, share: u64) -> Outcome {
    let mut left = share.min(budget.remaining());
    let mut limit = (problem.len() as u64).max(64);
    let mut round = 0usize;
    while left > 0 {
        let preorder = PREORDERS[round % PREORDERS.len()];
        let run = limit.min(left);
        let before = budget.remaining();
        let mut solver = Solver::new(problem, cap, preorder, run);
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

/// A static preorder: keys compared descending, ties by item index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Preorder {
    /// Area (size x duration), then peak section total.
    AreaTotal,
    /// Peak section total of unplaced bytes, then area.
    TotalArea,
}

/// The preorders the restarts cycle through.
const PREORDERS: [Preorder; 2] = [Preorder::AreaTotal, Preorder::TotalArea];

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

/// Search state for one capacity, one preorder and one node limit.
struct Solver<'p> {
    p: &'p Problem,
    cap: u64,
    preorder: Preorder,
    /// Position of each item in its partition's preorder.
    rank: Vec<u32>,
    nodes: u64,
    min_off: Vec<u64>,
    placed: Vec<bool>,
    section_bytes: Vec<u64>,
    /// For each boundary between sections s and s+1: unplaced items spanning it.
    cuts: Vec<u32>,
    trail: Vec<(u32, u64)>,
    /// Stack of candidate lists: (minimum offset, rank, item).
    cands: Vec<(u64, u32, u32)>,
    /// Offsets of the layout found (valid after `Status::Found`).
    solution: Vec<u64>,
}

impl<'p> Solver<'p> {
    fn new(p: &'p Problem, cap: u64, preorder: Preorder, nodes: u64) -> Solver<'p> {
        let mut diff = vec![0i64; p.sections + 1];
        for it in &p.items {
            if it.last > it.first + 1 {
                diff[it.first as usize] += 1;
                diff[it.last as usize - 1] -= 1;
            }
        }
        let mut run = 0i64;
        let cuts = diff
            .iter()
            .take(p.sections.saturating_sub(1))
            .map(|d| {
                run += d;
                u32::try_from(run).unwrap_or(0)
            })
            .collect();
        Solver {
            p,
            cap,
            preorder,
            rank: vec![0; p.len()],
            nodes,
            min_off: vec![0; p.len()],
            placed: vec![false; p.len()],
            section_bytes: super::bound::section_totals(p),
            cuts,
            trail: Vec::new(),
            cands: Vec::new(),
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
        let pieces = self.split(&root, zero_cuts);
        self.solve_pieces(&pieces, budget)
    }

    /// The non-empty pieces of the unplaced items of `part` between consecutive `cutpoints`.
    fn split(&self, part: &Part, cutpoints: Vec<u32>) -> Vec<Part> {
        let mut bounds = vec![part.lo];
        bounds.extend(cutpoints);
        bounds.push(part.hi);
        bounds
            .windows(2)
            .map(|w| Part {
                items: part
                    .items
                    .iter()
                    .copied()
                    .filter(|&i| {
                        let it = self.p.items[i as usize];
                        !self.placed[i as usize] && it.first >= w[0] && it.last <= w[1]
                    })
                    .collect(),
                lo: w[0],
                hi: w[1],
            })
            .filter(|sub| !sub.items.is_empty())
            .collect()
    }

    /// Solves independent pieces one after the other, each from a fresh canonical order.
    fn solve_pieces(&mut self, pieces: &[Part], budget: &mut SearchBudget) -> Status {
        for sub in pieces {
            let saved = self.rank_part(sub);
            let status = if self.check(sub, 0) {
                self.search(sub, 0, None, budget)
            } else {
                Status::NotFound
            };
            for (&i, r) in sub.items.iter().zip(saved) {
                self.rank[i as usize] = r;
            }
            if status != Status::Found {
                return status;
            }
        }
        Status::Found
    }

    /// Ranks the items of `part` by the preorder, with section totals of the bytes still
    /// unplaced; returns their previous ranks.
    fn rank_part(&mut self, part: &Part) -> Vec<u32> {
        let keys: Vec<(u128, u128)> = part
            .items
            .iter()
            .map(|&i| {
                let it = self.p.items[i as usize];
                let peak = self.section_bytes[it.first as usize..it.last as usize]
                    .iter()
                    .copied()
                    .max()
                    .unwrap_or(0);
                let a = area(self.p, i as usize);
                match self.preorder {
                    Preorder::AreaTotal => (a, u128::from(peak)),
                    Preorder::TotalArea => (u128::from(peak), a),
                }
            })
            .collect();
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

    /// Depth-first search over canonical placements of `part`; offsets must not drop below
    /// `last`, and at `last` itself ranks must exceed `last_rank`.
    fn search(
        &mut self,
        part: &Part,
        last: u64,
        last_rank: Option<u32>,
        budget: &mut SearchBudget,
    ) -> Status {
        if self.nodes == 0 || !budget.take() {
            return Status::Aborted;
        }
        self.nodes -= 1;
        // Candidates go on a shared stack (children push above and truncate back).
        let start = self.cands.len();
        let unplaced = || {
            part.items
                .iter()
                .map(|&i| i as usize)
                .filter(|&i| !self.placed[i])
        };
        let Some(min_height) = unplaced()
            .map(|i| self.min_off[i] + self.p.items[i].size)
            .min()
        else {
            return Status::Found;
        };
        for i in unplaced() {
            let (m, r) = (self.min_off[i], self.rank[i]);
            let after_last = m > last || (m == last && last_rank.is_none_or(|l| r > l));
            if after_last && m < min_height {
                self.cands.push((m, r, i as u32));
            }
        }
        self.cands[start..].sort_unstable();
        let mut status = Status::NotFound;
        for k in start..self.cands.len() {
            let (_, _, i) = self.cands[k];
            status = self.branch(part, i, budget);
            if status != Status::NotFound {
                break;
            }
        }
        self.cands.truncate(start);
        status
    }

    /// Places `i` at its minimum offset, searches below that, and takes the placement back.
    fn branch(&mut self, part: &Part, i: u32, budget: &mut SearchBudget) -> Status {
        let offset = self.min_off[i as usize];
        let mark = self.trail.len();
        let fits = self.place(i);
        let status = if fits && self.check(part, offset) {
            self.solution[i as usize] = offset;
            self.decompose(part, i, offset, budget)
        } else {
            Status::NotFound
        };
        self.unplace(i, mark);
        status
    }

    /// Continues in `part`, or in its independent pieces if placing `i` emptied a boundary.
    fn decompose(&mut self, part: &Part, i: u32, offset: u64, budget: &mut SearchBudget) -> Status {
        let it = self.p.items[i as usize];
        let boundaries = it.first..it.last.saturating_sub(1);
        let mut cutpoints = Vec::new();
        for s in boundaries.clone() {
            self.cuts[s as usize] -= 1;
            if self.cuts[s as usize] == 0 {
                cutpoints.push(s + 1);
            }
        }
        let pieces = if cutpoints.is_empty() {
            Vec::new()
        } else {
            self.split(part, cutpoints)
        };
        let status = if pieces.len() < 2 {
            // Nothing (or only one piece) split off: keep the current canonical order.
            self.search(part, offset, Some(self.rank[i as usize]), budget)
        } else {
            self.solve_pieces(&pieces, budget)
        };
        for s in boundaries {
            self.cuts[s as usize] += 1;
        }
        status
    }

    /// Marks `i` placed at its minimum offset and raises its unplaced neighbours; false when
    /// some neighbour no longer fits under the capacity.
    fn place(&mut self, i: u32) -> bool {
        let it = self.p.items[i as usize];
        self.placed[i as usize] = true;
        for s in it.first..it.last {
            self.section_bytes[s as usize] -= it.size;
        }
        let top = self.p.align_up(self.min_off[i as usize] + it.size);
        let mut fits = true;
        for &j in &self.p.neighbors[i as usize] {
            let j = j as usize;
            if !self.placed[j] && self.min_off[j] < top {
                self.trail.push((j as u32, self.min_off[j]));
                self.min_off[j] = top;
                fits &= top.saturating_add(self.p.items[j].size) <= self.cap;
            }
        }
        fits
    }

    /// Takes back the placement of `i` (trail entries above `mark`).
    fn unplace(&mut self, i: u32, mark: usize) {
        while self.trail.len() > mark {
            if let Some((j, old)) = self.trail.pop() {
                self.min_off[j as usize] = old;
            }
        }
        let it = self.p.items[i as usize];
        self.placed[i as usize] = false;
        for s in it.first..it.last {
            self.section_bytes[s as usize] += it.size;
        }
    }

    /// Section inference over `part`: in every section, the lowest offset any unplaced item
    /// there can take (at least `last`) plus their total bytes must fit under the capacity.
    /// Each section's scan stops at the first unplaced item low enough to pass.
    fn check(&self, part: &Part, last: u64) -> bool {
        (part.lo..part.hi).all(|s| {
            let bytes = self.section_bytes[s as usize];
            if bytes == 0 {
                return true;
            }
            let Some(threshold) = self.cap.checked_sub(bytes) else {
                return false;
            };
            last <= threshold
                && self.p.section_items[s as usize]
                    .iter()
                    .any(|&i| !self.placed[i as usize] && self.min_off[i as usize] <= threshold)
        })
    }
}
