//! Lower bounds on the arena size of any valid layout.

use super::problem::{align_up, Problem};
use super::BufferRequest;

/// Proven lower bound on the size of any valid layout of `requests` with offsets that are
/// multiples of `alignment`: the maximum over time of the live bytes, where every live buffer
/// but the topmost counts its size rounded up to the alignment (the topmost buffer needs no
/// padding above it, so the bound subtracts the largest padding of any buffer). It is never
/// below the plain sum of live sizes. Equals "max over time of the sum of aligned live sizes"
/// whenever every size is a multiple of the alignment. Zero-size buffers count nothing.
pub fn lower_bound(requests: &[BufferRequest], alignment: u64) -> u64 {
    // Events in time order, deaths before births at the same step (intervals are half-open):
    // (step, birth?, raw bytes, aligned bytes).
    let mut events: Vec<(u64, bool, u64, u64)> = Vec::new();
    let mut max_pad = 0u64;
    for r in requests.iter().filter(|r| r.is_live()) {
        let a = align_up(r.size, alignment);
        max_pad = max_pad.max(a - r.size);
        events.push((r.start, true, r.size, a));
        events.push((r.end, false, r.size, a));
    }
    events.sort_unstable_by_key(|&(t, birth, ..)| (t, birth));
    let (mut raw, mut aligned, mut best) = (0i128, 0i128, 0i128);
    for (_, birth, size, a) in events {
        let sign = if birth { 1 } else { -1 };
        raw += sign * i128::from(size);
        aligned += sign * i128::from(a);
        best = best.max(raw).max(aligned - i128::from(max_pad));
    }
    u64::try_from(best).unwrap_or(u64::MAX)
}

/// Sum of the raw sizes live in each section.
pub(crate) fn section_totals(problem: &Problem) -> Vec<u64> {
    let mut diff = vec![0i128; problem.sections + 1];
    for it in &problem.items {
        diff[it.first as usize] += i128::from(it.size);
        diff[it.last as usize] -= i128::from(it.size);
    }
    let mut run = 0i128;
    diff.iter()
        .take(problem.sections)
        .map(|d| {
            run += d;
            u64::try_from(run).unwrap_or(u64::MAX)
        })
        .collect()
}
