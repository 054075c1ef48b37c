//! The global arena: the one range taken from the upstream, handing superblocks to the arenas
//! and serving requests above the superblock size directly.
//!
//! Pure bookkeeping: addresses and sizes on the host, no CUDA, no `unsafe`. Free ranges are kept
//! coalesced and are searched by address-ordered first fit (as RMM's). A superblock takes the
//! whole free range when less than a further superblock would be left (as RMM's); a large block
//! takes exactly its size, so its remainder stays free and merges back with its neighbours.

use super::local::{AddressMap, Freed};
use super::superblock::SUPERBLOCK_MIN;
use std::collections::BTreeMap;

/// The global arena's bookkeeping.
#[derive(Debug)]
pub(super) struct GlobalArena {
    base: usize,
    size: usize,
    /// Free ranges by address: start -> length; never two adjacent.
    free: BTreeMap<usize, usize>,
    /// Large blocks served directly: start -> rounded size.
    large: AddressMap<usize>,
}

impl GlobalArena {
    /// A global arena over `[base, base + size)`, all free.
    pub(super) fn new(base: usize, size: usize) -> Self {
        let mut free = BTreeMap::new();
        if size > 0 {
            free.insert(base, size);
        }
        GlobalArena {
            base,
            size,
            free,
            large: AddressMap::default(),
        }
    }

    /// Carves at least `need` bytes from the first free range that has them: exactly `need` when
    /// `exact` or the rest is at least a superblock, else the whole range. Returns (start, length).
    fn carve(&mut self, need: usize, exact: bool) -> Option<(usize, usize)> {
        let (&start, &len) = self.free.iter().find(|(_, &len)| len >= need)?;
        self.free.remove(&start);
        if len - need >= SUPERBLOCK_MIN || (exact && len > need) {
            self.free.insert(start + need, len - need);
            Some((start, need))
        } else {
            Some((start, len))
        }
    }

    /// A superblock for a request of `bytes` (at most [`SUPERBLOCK_MIN`]): (start, size), with
    /// size at least [`SUPERBLOCK_MIN`] and `bytes`.
    ///
    /// # Time Complexity
    /// O(free ranges).
    pub(super) fn acquire(&mut self, bytes: usize) -> Option<(usize, usize)> {
        self.carve(bytes.max(SUPERBLOCK_MIN), false)
    }

    /// Takes back a range (a superblock, or a large block), merging it with free neighbours.
    ///
    /// # Time Complexity
    /// O(log free ranges).
    pub(super) fn release(&mut self, start: usize, size: usize) {
        let mut s = start;
        let mut len = size;
        if let Some((&prev, &prev_len)) = self.free.range(..start).next_back() {
            if prev + prev_len == start {
                self.free.remove(&prev);
                s = prev;
                len += prev_len;
            }
        }
        if let Some(next_len) = self.free.remove(&(start + size)) {
            len += next_len;
        }
        self.free.insert(s, len);
    }

    /// Serves a large request of `bytes` (rounded) directly.
    ///
    /// # Time Complexity
    /// O(free ranges).
    pub(super) fn allocate_large(&mut self, bytes: usize) -> Option<usize> {
        let (start, _) = self.carve(bytes, true)?;
        self.large.insert(start, bytes);
        Some(start)
    }

    /// Frees a large block.
    pub(super) fn deallocate_large(&mut self, ptr: usize, bytes: usize) -> Freed {
        match self.large.get(&ptr) {
            None => Freed::NotHere,
            Some(&size) if size != bytes => Freed::WrongSize(size),
            Some(&size) => {
                self.large.remove(&ptr);
                self.release(ptr, size);
                Freed::Done
            }
        }
    }

    /// The range taken from the upstream: (base, size).
    pub(super) fn extent(&self) -> (usize, usize) {
        (self.base, self.size)
    }

    /// Free bytes in the global arena.
    pub(super) fn free_bytes(&self) -> usize {
        self.free.values().sum()
    }

    /// The largest free range.
    pub(super) fn largest_free(&self) -> usize {
        self.free.values().copied().max().unwrap_or(0)
    }

    /// The free ranges in address order, as (start, length).
    pub(super) fn free_ranges(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.free.iter().map(|(&s, &l)| (s, l))
    }

    /// Number of live large blocks and the bytes they hold.
    pub(super) fn large_blocks(&self) -> (usize, usize) {
        (self.large.len(), self.large.values().sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = SUPERBLOCK_MIN;
    const BASE: usize = 0x7000_0000;

    #[test]
    fn superblocks_are_a_mib_and_leave_no_tail_below_a_superblock() {
        let mut g = GlobalArena::new(BASE, 3 * MIB + MIB / 2);
        assert_eq!(g.acquire(256), Some((BASE, MIB)));
        assert_eq!(g.acquire(MIB), Some((BASE + MIB, MIB)));
        // 1.5 MiB left: too little to split, so the superblock takes all of it.
        assert_eq!(g.acquire(512), Some((BASE + 2 * MIB, MIB + MIB / 2)));
        assert_eq!(g.acquire(256), None);
        g.release(BASE + MIB, MIB);
        g.release(BASE, MIB);
        g.release(BASE + 2 * MIB, MIB + MIB / 2);
        assert_eq!(
            g.free_ranges().collect::<Vec<_>>(),
            vec![(BASE, 3 * MIB + MIB / 2)]
        );
        assert_eq!(g.extent(), (BASE, 3 * MIB + MIB / 2));
    }

    #[test]
    fn large_blocks_are_served_directly_and_checked_on_free() {
        let mut g = GlobalArena::new(BASE, 8 * MIB);
        let a = g.allocate_large(2 * MIB + 256).unwrap();
        let b = g.allocate_large(3 * MIB).unwrap();
        assert_eq!((a, b), (BASE, BASE + 2 * MIB + 256));
        assert_eq!(g.large_blocks(), (2, 5 * MIB + 256));
        assert_eq!(
            g.deallocate_large(a, 2 * MIB),
            Freed::WrongSize(2 * MIB + 256)
        );
        assert_eq!(g.deallocate_large(a + 256, 2 * MIB), Freed::NotHere);
        assert_eq!(g.deallocate_large(a, 2 * MIB + 256), Freed::Done);
        assert_eq!(g.deallocate_large(a, 2 * MIB + 256), Freed::NotHere);
        // 3 MiB - 256 left at the end: a 2.5 MiB block takes exactly its size.
        let c = g.allocate_large(5 * MIB / 2).unwrap();
        assert_eq!(c, BASE + 5 * MIB + 256);
        assert_eq!(g.large_blocks(), (2, 3 * MIB + 5 * MIB / 2));
        assert_eq!(g.free_bytes(), 8 * MIB - 3 * MIB - 5 * MIB / 2);
        assert_eq!(g.deallocate_large(b, 3 * MIB), Freed::Done);
        assert_eq!(g.deallocate_large(c, 5 * MIB / 2), Freed::Done);
        assert_eq!(g.free_bytes(), 8 * MIB);
        assert_eq!(g.largest_free(), 8 * MIB);
    }
}
