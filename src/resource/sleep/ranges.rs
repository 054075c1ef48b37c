//! Ranges of addresses as a sleep reads them: the free ranges and live blocks of a tenant's
//! segments, and sorted, disjoint ranges joined, subtracted and intersected.

use crate::report::snapshot::{BlockState, SegmentInfo};

/// What a sleeper learns of an address from one tenant's segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TenantLookup {
    /// Outside the tenant's chunks.
    NotHeld,
    /// Inside a chunk, in no live block (free: a tag of it would be a use after free).
    Free,
    /// Inside this live block (start, bytes).
    Live(usize, usize),
}

/// The free ranges (start, bytes) of `segments`.
pub fn free_ranges(segments: &[SegmentInfo]) -> Vec<(usize, usize)> {
    segments
        .iter()
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state == BlockState::Free && b.size > 0)
        .map(|b| (b.address, b.size))
        .collect()
}

/// Where `addr` lies in `segments`.
pub fn lookup(segments: &[SegmentInfo], addr: usize) -> TenantLookup {
    let Some(seg) = segments
        .iter()
        .find(|s| addr >= s.address && addr - s.address < s.total_size)
    else {
        return TenantLookup::NotHeld;
    };
    match seg
        .blocks
        .iter()
        .find(|b| addr >= b.address && addr - b.address < b.size.max(1))
    {
        Some(b) if b.state == BlockState::Allocated => TenantLookup::Live(b.address, b.size),
        _ => TenantLookup::Free,
    }
}

/// Sorted, disjoint ranges (start, bytes) covering `ranges` (touching ones joined).
pub fn merged(mut ranges: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
    ranges.retain(|&(_, n)| n > 0);
    ranges.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(ranges.len());
    for (a, n) in ranges {
        match out.last_mut() {
            Some(last) if a <= last.0 + last.1 => {
                let end = (last.0 + last.1).max(a + n);
                last.1 = end - last.0;
            }
            _ => out.push((a, n)),
        }
    }
    out
}

/// The parts of `a` outside `b`; both sorted and disjoint ([`merged`]), and so is the result.
pub fn subtract(a: &[(usize, usize)], b: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut j = 0;
    for &(start, len) in a {
        let end = start + len;
        let mut at = start;
        while j < b.len() && b[j].0 + b[j].1 <= at {
            j += 1;
        }
        let mut k = j;
        while k < b.len() && b[k].0 < end {
            let (hs, he) = (b[k].0, b[k].0 + b[k].1);
            if hs > at {
                out.push((at, hs - at));
            }
            at = at.max(he);
            k += 1;
        }
        if at < end {
            out.push((at, end - at));
        }
    }
    out
}

/// The parts of `a` inside `b`; both sorted and disjoint ([`merged`]).
pub fn intersect(a: &[(usize, usize)], b: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let outside = subtract(a, b);
    subtract(a, &outside)
}

/// Total bytes of `ranges`.
pub fn total(ranges: &[(usize, usize)]) -> usize {
    ranges.iter().map(|&(_, n)| n).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte-level model of the range operations.
    fn bytes_of(ranges: &[(usize, usize)]) -> std::collections::BTreeSet<usize> {
        ranges.iter().flat_map(|&(a, n)| a..a + n).collect()
    }

    proptest::proptest! {
        #[test]
        fn range_operations_match_a_set_of_bytes(
            a in proptest::collection::vec((0usize..200, 0usize..40), 0..8),
            b in proptest::collection::vec((0usize..200, 0usize..40), 0..8),
        ) {
            let (ma, mb) = (merged(a.clone()), merged(b.clone()));
            proptest::prop_assert_eq!(bytes_of(&ma), bytes_of(&a));
            proptest::prop_assert!(ma.windows(2).all(|w| w[0].0 + w[0].1 < w[1].0));
            let (sa, sb) = (bytes_of(&a), bytes_of(&b));
            let diff = subtract(&ma, &mb);
            proptest::prop_assert_eq!(bytes_of(&diff), sa.difference(&sb).copied().collect());
            proptest::prop_assert!(diff.iter().all(|&(_, n)| n > 0));
            let both = intersect(&ma, &mb);
            proptest::prop_assert_eq!(bytes_of(&both), sa.intersection(&sb).copied().collect());
            proptest::prop_assert_eq!(total(&diff) + total(&both), total(&ma));
        }
    }
}
