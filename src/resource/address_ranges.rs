//! Free address ranges, best fit, merged when freed: the bookkeeping of the simulated device's
//! placement, and of the windows the simulated devices take from the simulated address space.

use std::collections::{BTreeMap, BTreeSet};

/// Free ranges of an address space: best-fit placement, neighbours merged on return.
///
/// # Time Complexity
/// O(log n) per call in the number of free ranges.
#[derive(Debug, Default)]
pub(crate) struct AddressRanges {
    /// Free ranges by address: start -> length.
    by_address: BTreeMap<usize, usize>,
    /// Free ranges by (length, start), for best fit.
    by_size: BTreeSet<(usize, usize)>,
}

impl AddressRanges {
    /// An address space of `[start, start + len)`, all free.
    pub(crate) fn new(start: usize, len: usize) -> Self {
        let mut ranges = AddressRanges::default();
        if len > 0 {
            ranges.by_address.insert(start, len);
            ranges.by_size.insert((len, start));
        }
        ranges
    }

    /// Takes `len` bytes of address space (the smallest free range that holds them, lowest
    /// first); `None` if no range is that large.
    pub(crate) fn place(&mut self, len: usize) -> Option<usize> {
        let &(range, start) = self.by_size.range((len, 0)..).next()?;
        self.by_size.remove(&(range, start));
        self.by_address.remove(&start);
        if range > len {
            self.by_address.insert(start + len, range - len);
            self.by_size.insert((range - len, start + len));
        }
        Some(start)
    }

    /// Returns `[start, start + len)`, which [`Self::place`] handed out, merging it with its
    /// free neighbours.
    pub(crate) fn unplace(&mut self, mut start: usize, mut len: usize) {
        if let Some((&prev, &prev_len)) = self.by_address.range(..start).next_back() {
            if prev + prev_len == start {
                self.by_address.remove(&prev);
                self.by_size.remove(&(prev_len, prev));
                start = prev;
                len += prev_len;
            }
        }
        if let Some(&next_len) = self.by_address.get(&(start + len)) {
            let next = start + len;
            self.by_address.remove(&next);
            self.by_size.remove(&(next_len, next));
            len += next_len;
        }
        self.by_address.insert(start, len);
        self.by_size.insert((len, start));
    }

    /// Number of free ranges.
    #[cfg(test)]
    pub(crate) fn free_ranges(&self) -> usize {
        self.by_address.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_and_merging_give_the_space_back_whole() {
        let mut r = AddressRanges::new(0x1000, 0x10000);
        let a = r.place(0x1000).unwrap();
        let b = r.place(0x2000).unwrap();
        let c = r.place(0x1000).unwrap();
        assert_eq!((a, b, c), (0x1000, 0x2000, 0x4000));
        r.unplace(a, 0x1000);
        // The hole of 0x1000 is the best fit for 0x800.
        assert_eq!(r.place(0x800), Some(0x1000));
        r.unplace(0x1000, 0x800);
        r.unplace(b, 0x2000);
        r.unplace(c, 0x1000);
        assert_eq!(r.free_ranges(), 1);
        assert_eq!(r.place(0x10000), Some(0x1000));
        assert_eq!(r.place(1), None);
    }
}
