//! Independent layout checker (shares no code with the layout engine).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use super::BufferRequest;

/// One way a layout can be wrong; buffer indices refer to the request list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutViolation {
    /// The offset list does not have one entry per request.
    #[error("layout has {got} offsets for {expected} buffers")]
    WrongCount {
        /// Number of requests.
        expected: usize,
        /// Number of offsets given.
        got: usize,
    },
    /// An offset is not a multiple of the alignment.
    #[error("buffer {buffer} at offset {offset} is not a multiple of the alignment")]
    Misaligned {
        /// Request index.
        buffer: usize,
        /// Its offset.
        offset: u64,
    },
    /// Two buffers live at the same time share bytes.
    #[error("buffers {a} and {b} are live at the same time and overlap in memory")]
    Overlap {
        /// Lower request index.
        a: usize,
        /// Higher request index.
        b: usize,
    },
    /// A buffer extends past the end of the arena.
    #[error("buffer {buffer} ends at byte {end}, past the arena size {arena}")]
    OutOfArena {
        /// Request index.
        buffer: usize,
        /// offset + size.
        end: u64,
        /// The arena size.
        arena: u64,
    },
}

/// Checks a layout: one offset per request, every offset a multiple of `alignment` (0 counts
/// as 1), buffers whose live intervals intersect are disjoint in bytes, and every buffer ends
/// within `arena_size`. Zero-size buffers and empty intervals never conflict, but their offsets
/// must still be aligned and within the arena. Returns every violation found (overlaps sorted
/// by `(a, b)`), or `Ok(())`.
pub fn validate(
    requests: &[BufferRequest],
    offsets: &[u64],
    arena_size: u64,
    alignment: u64,
) -> Result<(), Vec<LayoutViolation>> {
    if requests.len() != offsets.len() {
        return Err(vec![LayoutViolation::WrongCount {
            expected: requests.len(),
            got: offsets.len(),
        }]);
    }
    let alignment = alignment.max(1);
    let mut violations = Vec::new();
    for (buffer, (r, &offset)) in requests.iter().zip(offsets).enumerate() {
        if offset % alignment != 0 {
            violations.push(LayoutViolation::Misaligned { buffer, offset });
        }
        let end = u128::from(offset) + u128::from(r.size);
        if end > u128::from(arena_size) {
            violations.push(LayoutViolation::OutOfArena {
                buffer,
                end: u64::try_from(end).unwrap_or(u64::MAX),
                arena: arena_size,
            });
        }
    }
    if !disjoint(requests, offsets) {
        violations.extend(overlaps(requests, offsets));
    }
    if violations.is_empty() {
        Ok(())
    } else {
        Err(violations)
    }
}

/// True iff no two time-conflicting buffers share a byte, in O(n log n): a sweep over start
/// times keeps the live buffers by offset; while they are pairwise disjoint, a new buffer can
/// only overlap the live buffer just below its offset or the one at or just above it.
fn disjoint(requests: &[BufferRequest], offsets: &[u64]) -> bool {
    let mut order: Vec<usize> = (0..requests.len())
        .filter(|&i| requests[i].size > 0 && requests[i].start < requests[i].end)
        .collect();
    order.sort_by_key(|&i| (requests[i].start, i));
    let mut live: BTreeMap<(u64, usize), u128> = BTreeMap::new();
    let mut ending: BinaryHeap<Reverse<(u64, u64, usize)>> = BinaryHeap::new();
    for &i in &order {
        let r = requests[i];
        while let Some(&Reverse((end, offset, j))) = ending.peek() {
            if end > r.start {
                break;
            }
            ending.pop();
            live.remove(&(offset, j));
        }
        let (lo, hi) = (offsets[i], u128::from(offsets[i]) + u128::from(r.size));
        let below = live.range(..(lo, i)).next_back();
        let above = live.range((lo, i)..).next();
        if below.is_some_and(|(_, &end)| end > u128::from(lo))
            || above.is_some_and(|(&(start, _), _)| u128::from(start) < hi)
        {
            return false;
        }
        live.insert((lo, i), hi);
        ending.push(Reverse((r.end, lo, i)));
    }
    true
}

/// All pairs of time-conflicting buffers whose byte ranges intersect, by a sweep over start times.
fn overlaps(requests: &[BufferRequest], offsets: &[u64]) -> Vec<LayoutViolation> {
    let mut order: Vec<usize> = (0..requests.len())
        .filter(|&i| requests[i].size > 0 && requests[i].start < requests[i].end)
        .collect();
    order.sort_by_key(|&i| (requests[i].start, i));
    let bytes = |i: usize| {
        let lo = u128::from(offsets[i]);
        (lo, lo + u128::from(requests[i].size))
    };
    let mut active: Vec<usize> = Vec::new();
    let mut found = Vec::new();
    for &i in &order {
        active.retain(|&j| requests[j].end > requests[i].start);
        let (lo, hi) = bytes(i);
        for &j in &active {
            let (jlo, jhi) = bytes(j);
            if lo < jhi && jlo < hi {
                found.push(LayoutViolation::Overlap {
                    a: i.min(j),
                    b: i.max(j),
                });
            }
        }
        active.push(i);
    }
    found.sort_by_key(|v| match v {
        LayoutViolation::Overlap { a, b } => (*a, *b),
        _ => (usize::MAX, usize::MAX),
    });
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(size: u64, start: u64, end: u64) -> BufferRequest {
        BufferRequest { size, start, end }
    }

    #[test]
    fn accepts_a_valid_layout() {
        let reqs = [req(4, 0, 2), req(4, 1, 3), req(4, 2, 4), req(0, 0, 9)];
        assert_eq!(validate(&reqs, &[0, 4, 0, 0], 8, 4), Ok(()));
    }

    #[test]
    fn rejects_overlap_misalignment_and_overflow() {
        let reqs = [req(4, 0, 2), req(4, 1, 3), req(4, 2, 4)];
        let Err(errors) = validate(&reqs, &[0, 2, 6], 8, 2) else {
            unreachable!("overlap accepted")
        };
        assert_eq!(
            errors,
            vec![
                LayoutViolation::OutOfArena {
                    buffer: 2,
                    end: 10,
                    arena: 8
                },
                LayoutViolation::Overlap { a: 0, b: 1 },
            ]
        );
        let Err(errors) = validate(&reqs, &[0, 5, 0], 16, 4) else {
            unreachable!("misalignment accepted")
        };
        assert_eq!(
            errors,
            vec![LayoutViolation::Misaligned {
                buffer: 1,
                offset: 5
            }]
        );
        assert!(errors[0].to_string().contains("buffer 1"));
    }

    /// The sweep that answers "no overlap" in O(n log n) agrees with listing every pair, on
    /// random layouts of which many overlap.
    #[test]
    fn the_fast_check_agrees_with_all_pairs() {
        use super::super::tests::{random_instance, Rng};
        let mut rng = Rng::new(17);
        let mut overlapping = 0;
        for round in 0..2000 {
            let count = 1 + rng.below(12) as usize;
            let reqs = random_instance(&mut rng, count, 10, 16);
            let offsets: Vec<u64> = reqs.iter().map(|_| rng.below(40)).collect();
            let listed = overlaps(&reqs, &offsets);
            assert_eq!(
                disjoint(&reqs, &offsets),
                listed.is_empty(),
                "round {round}"
            );
            overlapping += usize::from(!listed.is_empty());
        }
        assert!((500..1500).contains(&overlapping), "{overlapping}");
    }

    #[test]
    fn touching_intervals_may_share_bytes() {
        let reqs = [req(4, 0, 2), req(4, 2, 4)];
        assert_eq!(validate(&reqs, &[0, 0], 4, 1), Ok(()));
        assert_eq!(
            validate(&reqs, &[0], 4, 1),
            Err(vec![LayoutViolation::WrongCount {
                expected: 2,
                got: 1
            }])
        );
    }
}
