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
    problem_bound(&Problem::new(requests, alignment))
}

/// [`lower_bound`] on a normalised problem.
pub(crate) fn problem_bound(problem: &Problem) -> u64 {
    let sections = problem.sections;
    let mut raw = vec![0i128; sections + 1];
    let mut aligned = vec![0i128; sections + 1];
    let mut max_pad = 0u64;
    for it in &problem.items {
        let a = align_up(it.size, problem.alignment);
        max_pad = max_pad.max(a - it.size);
        raw[it.first as usize] += i128::from(it.size);
        raw[it.last as usize] -= i128::from(it.size);
        aligned[it.first as usize] += i128::from(a);
        aligned[it.last as usize] -= i128::from(a);
    }
    let (mut run_raw, mut run_aligned, mut best) = (0i128, 0i128, 0i128);
    for s in 0..sections {
        run_raw += raw[s];
        run_aligned += aligned[s];
        best = best.max(run_raw).max(run_aligned - i128::from(max_pad));
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
