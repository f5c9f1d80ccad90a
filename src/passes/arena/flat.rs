//! Flat, read-only views of a layout problem (CSR section lists, slot tables)
//! that every restart of the exact search shares.

use super::problem::Problem;

/// Flat, read-only views of a problem used by every restart.
pub(super) struct Static {
    pub(super) size: Vec<u64>,
    pub(super) first: Vec<u32>,
    pub(super) last: Vec<u32>,
    /// Section lists in CSR form: section `s` owns `sec_items[sec_off[s]..sec_off[s + 1]]`.
    pub(super) sec_off: Vec<u32>,
    pub(super) sec_items: Vec<u32>,
    /// For item `i`, the index of its first slot; slot `slot_base[i] + (s - first[i])` holds
    /// the position of `i` in section `s`'s list.
    pub(super) slot_base: Vec<u32>,
    /// Initial slot contents.
    pub(super) slots: Vec<u32>,
    /// Unplaced bytes per section before any placement.
    pub(super) totals: Vec<u64>,
    /// For each boundary between sections s and s + 1, the items spanning it.
    pub(super) cuts: Vec<u32>,
}

impl Static {
    /// The flat views of `p`.
    pub(super) fn new(p: &Problem) -> Static {
        // Each section's items, ascending: counted, then filled in item order.
        let mut sec_off = vec![0u32; p.sections + 1];
        for it in &p.items {
            for count in &mut sec_off[it.first as usize + 1..=it.last as usize] {
                *count += 1;
            }
        }
        for s in 0..p.sections {
            sec_off[s + 1] += sec_off[s];
        }
        let mut fill = sec_off.clone();
        let mut sec_items = vec![0u32; sec_off[p.sections] as usize];
        for (i, it) in p.items.iter().enumerate() {
            for s in it.first as usize..it.last as usize {
                sec_items[fill[s] as usize] = i as u32;
                fill[s] += 1;
            }
        }
        let mut slot_base = Vec::with_capacity(p.len());
        let mut total_slots = 0u32;
        for it in &p.items {
            slot_base.push(total_slots);
            total_slots += it.last - it.first;
        }
        let mut slots = vec![0u32; total_slots as usize];
        for s in 0..p.sections {
            for k in sec_off[s]..sec_off[s + 1] {
                let i = sec_items[k as usize] as usize;
                let it = p.items[i];
                slots[(slot_base[i] + s as u32 - it.first) as usize] = k;
            }
        }
        let mut cuts = vec![0u32; p.sections.saturating_sub(1)];
        for it in &p.items {
            for c in &mut cuts[it.first as usize..(it.last as usize).saturating_sub(1)] {
                *c += 1;
            }
        }
        Static {
            size: p.items.iter().map(|it| it.size).collect(),
            first: p.items.iter().map(|it| it.first).collect(),
            last: p.items.iter().map(|it| it.last).collect(),
            sec_off,
            sec_items,
            slot_base,
            slots,
            totals: super::bound::section_totals(p),
            cuts,
        }
    }
}
