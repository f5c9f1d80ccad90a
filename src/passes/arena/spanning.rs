//! Buffers live for the whole step (parameters, optimizer state) laid out outside the search.
//! Such a buffer is live whenever any other is, so in any layout it owns its address range
//! outright; with a size that is a multiple of the alignment, cutting that range out of an
//! optimal layout and stacking it at the bottom keeps every offset aligned and changes no
//! size. The search then runs on the other buffers alone, without the conflicts of the
//! spanning ones with everything (quadratic in the model's depth).

use super::{BufferRequest, Layout, LayoutOptions};

/// The live buffers, in request order, whose size is a multiple of `alignment` and whose
/// interval covers every live buffer's.
fn spanning(requests: &[BufferRequest], alignment: u64) -> Vec<usize> {
    let live = || requests.iter().filter(|r| r.is_live());
    let (Some(first), Some(last)) = (live().map(|r| r.start).min(), live().map(|r| r.end).max())
    else {
        return Vec::new();
    };
    requests
        .iter()
        .enumerate()
        .filter(|(_, r)| {
            r.is_live() && r.start <= first && r.end >= last && r.size.is_multiple_of(alignment)
        })
        .map(|(i, _)| i)
        .collect()
}

/// `search`'s layout of `requests` with the spanning buffers stacked at offset 0 upwards, in
/// request order, and the rest above them: the same size, lower bound and optimality as
/// `search` on all of them would prove, from a smaller problem.
pub(super) fn stacked_below(
    requests: &[BufferRequest],
    options: &LayoutOptions,
    search: fn(&[BufferRequest], &LayoutOptions) -> Layout,
) -> Layout {
    let spanning = spanning(requests, options.alignment.max(1));
    if spanning.is_empty() {
        return search(requests, options);
    }
    let mut offsets = vec![0; requests.len()];
    let mut base = 0u64;
    let mut rest = requests.to_vec();
    for &i in &spanning {
        offsets[i] = base;
        base = base.saturating_add(requests[i].size);
        rest[i].size = 0;
    }
    let inner = search(
        &rest,
        &LayoutOptions {
            capacity: options.capacity.map(|c| c.saturating_sub(base)),
            ..options.clone()
        },
    );
    for (i, r) in rest.iter().enumerate() {
        if r.is_live() {
            offsets[i] = base.saturating_add(inner.offsets[i]);
        }
    }
    Layout {
        offsets,
        size: base.saturating_add(inner.size),
        lower_bound: base.saturating_add(inner.lower_bound),
        heuristic_size: base.saturating_add(inner.heuristic_size),
        optimal: inner.optimal,
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{random_instance, Rng};
    use super::super::{layout, layout_all, lower_bound, validate};
    use super::*;
    use std::time::Duration;

    /// Random instances with some buffers spanning the whole horizon, aligned or not: the
    /// stacked layout is valid, as small as the search over everything finds (both optimal),
    /// and its bound is never below the plain bound.
    #[test]
    fn spanning_buffers_stacked_below_lose_nothing() {
        let mut rng = Rng::new(5);
        let (mut stacked_rounds, mut compared) = (0, 0);
        for round in 0..200 {
            let alignment = [1, 8, 64][round % 3];
            let count = 2 + rng.below(12) as usize;
            let mut reqs = random_instance(&mut rng, count, 12, 300);
            for _ in 0..1 + rng.below(4) {
                let size = 1 + rng.below(200);
                let size = if rng.below(2) == 0 {
                    size * alignment
                } else {
                    size
                };
                reqs.push(BufferRequest {
                    size,
                    start: 0,
                    end: 12,
                });
            }
            let options = LayoutOptions {
                alignment,
                time_limit: Duration::from_millis(200),
                capacity: None,
            };
            let (stacked, all) = (layout(&reqs, &options), layout_all(&reqs, &options));
            stacked_rounds += usize::from(!spanning(&reqs, alignment).is_empty());
            assert_eq!(
                validate(&reqs, &stacked.offsets, stacked.size, alignment),
                Ok(())
            );
            assert!(
                stacked.lower_bound >= lower_bound(&reqs, alignment),
                "round {round}"
            );
            assert!(stacked.lower_bound <= stacked.size, "round {round}");
            if stacked.optimal && all.optimal {
                assert_eq!(stacked.size, all.size, "round {round}: {reqs:?}");
                compared += 1;
            }
        }
        assert!(
            stacked_rounds >= 100 && compared >= 150,
            "{stacked_rounds} {compared}"
        );
    }
}
