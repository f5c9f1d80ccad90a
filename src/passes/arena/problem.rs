//! Normalised problem: live buffers only, time compressed to sections, conflict lists.

use super::BufferRequest;

/// A live buffer in normalised form.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Item {
    /// Raw size in bytes (non-zero).
    pub size: u64,
    /// First section index (inclusive): the first end time after `start`.
    pub first: u32,
    /// Last section index (exclusive): one past the section of its own end time.
    pub last: u32,
    /// Original start step (for orderings).
    pub start: u64,
    /// Original end step (for orderings).
    pub end: u64,
}

impl Item {
    /// Live duration in steps.
    pub fn duration(&self) -> u64 {
        self.end - self.start
    }
}

/// The live buffers of a request list, with their time-conflict graph.
#[derive(Debug, Clone)]
pub(crate) struct Problem {
    /// Offset granularity (power of two, at least 1).
    pub alignment: u64,
    /// Live buffers.
    pub items: Vec<Item>,
    /// For each item, the original request index.
    pub origin: Vec<usize>,
    /// Number of original requests.
    pub total: usize,
    /// Number of sections (one per distinct end time; see [`Problem::new`]).
    pub sections: usize,
    /// The conflict lists in CSR form: item `i`'s neighbours (the items whose intervals
    /// intersect its own) are `neighbor_list[neighbor_start[i]..neighbor_start[i + 1]]`.
    pub neighbor_start: Vec<usize>,
    /// See `neighbor_start`.
    pub neighbor_list: Vec<u32>,
}

impl Problem {
    /// Normalises `requests`; zero-size or empty-interval buffers are dropped (offset 0).
    pub fn new(requests: &[BufferRequest], alignment: u64) -> Problem {
        let live: Vec<(usize, BufferRequest)> = requests
            .iter()
            .copied()
            .enumerate()
            .filter(|(_, r)| r.is_live())
            .collect();
        // One section per distinct end time: the buffers live just before it (a maximal set of
        // pairwise-overlapping buffers). Two buffers overlap iff they share a section.
        let mut times: Vec<u64> = live.iter().map(|(_, r)| r.end).collect();
        times.sort_unstable();
        times.dedup();
        let section = |t: u64| times.partition_point(|&x| x <= t) as u32;
        let items: Vec<Item> = live
            .iter()
            .map(|(_, r)| Item {
                size: r.size,
                first: section(r.start),
                last: section(r.end),
                start: r.start,
                end: r.end,
            })
            .collect();
        let (neighbor_start, neighbor_list) = conflict_lists(&items);
        let sections = times.len();
        Problem {
            alignment: alignment.max(1),
            origin: live.iter().map(|(i, _)| *i).collect(),
            total: requests.len(),
            sections,
            items,
            neighbor_start,
            neighbor_list,
        }
    }

    /// The items whose intervals intersect item `i`'s.
    pub fn neighbors(&self, i: usize) -> &[u32] {
        &self.neighbor_list[self.neighbor_start[i]..self.neighbor_start[i + 1]]
    }

    /// Number of live buffers.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Rounds `x` up to the alignment (saturating).
    pub fn align_up(&self, x: u64) -> u64 {
        align_up(x, self.alignment)
    }

    /// max(offset + size) over live items, for offsets indexed like `items`.
    pub fn layout_size(&self, offsets: &[u64]) -> u64 {
        self.items
            .iter()
            .zip(offsets)
            .map(|(it, &o)| o.saturating_add(it.size))
            .max()
            .unwrap_or(0)
    }

    /// Maps item offsets back to one offset per original request (0 for dropped buffers).
    pub fn expand(&self, offsets: &[u64]) -> Vec<u64> {
        let mut out = vec![0; self.total];
        for (&i, &o) in self.origin.iter().zip(offsets) {
            out[i] = o;
        }
        out
    }
}

/// Rounds `x` up to a multiple of `alignment` (0 counts as 1; saturating at the top).
pub(crate) fn align_up(x: u64, alignment: u64) -> u64 {
    let a = alignment.max(1);
    x.div_ceil(a).saturating_mul(a)
}

/// Conflict lists in CSR form (start of each item's list, then the lists) by two sweeps over
/// start times, one counting and one filling: O(n log n + conflicts), no slack capacity. Each
/// list is in sweep order (a function of the input alone); no consumer depends on the order.
fn conflict_lists(items: &[Item]) -> (Vec<usize>, Vec<u32>) {
    let mut order: Vec<u32> = (0..items.len() as u32).collect();
    order.sort_by_key(|&i| (items[i as usize].first, i));
    let sweep = |visit: &mut dyn FnMut(u32, u32)| {
        let mut active: Vec<u32> = Vec::new();
        for &i in &order {
            let it = items[i as usize];
            active.retain(|&j| items[j as usize].last > it.first);
            for &j in &active {
                visit(i, j);
            }
            active.push(i);
        }
    };
    let mut start = vec![0usize; items.len() + 1];
    sweep(&mut |i, j| {
        start[i as usize + 1] += 1;
        start[j as usize + 1] += 1;
    });
    for k in 0..items.len() {
        start[k + 1] += start[k];
    }
    let mut fill = start.clone();
    let mut list = vec![0u32; start[items.len()]];
    sweep(&mut |i, j| {
        for (a, b) in [(i, j), (j, i)] {
            list[fill[a as usize]] = b;
            fill[a as usize] += 1;
        }
    });
    (start, list)
}
