//! The global arena: the one range taken from the upstream, handing superblocks to the arenas
//! and serving requests above the superblock size directly.
//!
//! Pure bookkeeping: addresses and sizes on the host, no CUDA, no `unsafe`. The free ranges are
//! one region of a [`RangeHeap`] (good fit, coalesced, O(1) per operation); superblocks and
//! large blocks are its taken ranges, told apart by tag. A superblock takes the whole free range
//! when less than a further superblock would be left (as RMM's); a large block takes exactly its
//! size, so its remainder stays free and merges back with its neighbours. The streams whose
//! frees into it are not yet known complete are its [`PendingFrees`].

use super::local::Freed;
use super::ordering::PendingFrees;
use super::ranges::{GiveBack, RangeHeap};
use super::superblock::SUPERBLOCK_MIN;
use crate::suballocator::core::ListCounters;

/// The heap tag of a superblock lent to an arena.
const SUPERBLOCK: u8 = 1;
/// The heap tag of a large block.
const LARGE: u8 = 2;

/// The global arena's bookkeeping.
#[derive(Debug)]
pub(super) struct GlobalArena {
    base: usize,
    size: usize,
    heap: RangeHeap,
    /// Number of live large blocks and the bytes they hold.
    large: (usize, usize),
    /// The large blocks' figures (`memory_stats`).
    pub(super) counters: ListCounters,
    /// Frees on default streams not yet covered by a host synchronisation.
    pub(super) pending: PendingFrees,
}

impl GlobalArena {
    /// A global arena over `[base, base + size)` (a multiple of 256 bytes), all free.
    pub(super) fn new(base: usize, size: usize) -> Self {
        let mut heap = RangeHeap::default();
        if size > 0 {
            heap.add_region(base, size, 0);
        }
        GlobalArena {
            base,
            size,
            heap,
            large: (0, 0),
            counters: ListCounters::default(),
            pending: PendingFrees::default(),
        }
    }

    /// A superblock for a request of `bytes` (at most [`SUPERBLOCK_MIN`]): (start, size), with
    /// size at least [`SUPERBLOCK_MIN`] and `bytes`.
    ///
    /// # Time Complexity
    /// O(1).
    pub(super) fn acquire(&mut self, bytes: usize) -> Option<(usize, usize)> {
        let t = self
            .heap
            .take(bytes.max(SUPERBLOCK_MIN), SUPERBLOCK_MIN, SUPERBLOCK)?;
        Some((t.start, t.len))
    }

    /// Takes back a superblock that [`GlobalArena::acquire`] lent, merging it with free
    /// neighbours.
    ///
    /// # Time Complexity
    /// O(1).
    pub(super) fn release(&mut self, start: usize, size: usize) {
        let back = self.heap.give_back(start, size, SUPERBLOCK);
        debug_assert!(matches!(back, GiveBack::Done(_)), "{back:?}");
    }

    /// Serves a large request of `bytes` (rounded) directly.
    ///
    /// # Time Complexity
    /// O(1).
    pub(super) fn allocate_large(&mut self, bytes: usize) -> Option<usize> {
        let t = self.heap.take(bytes, 1, LARGE)?;
        self.large.0 += 1;
        self.large.1 += t.len;
        self.counters.allocated(t.len);
        Some(t.start)
    }

    /// Frees a large block of `bytes` (rounded).
    ///
    /// # Time Complexity
    /// O(1).
    pub(super) fn deallocate_large(&mut self, ptr: usize, bytes: usize) -> Freed {
        match self.heap.give_back(ptr, bytes, LARGE) {
            GiveBack::Done(_) => {
                self.large.0 -= 1;
                self.large.1 -= bytes;
                self.counters.freed(bytes);
                Freed::Done
            }
            GiveBack::NotHere => Freed::NotHere,
            GiveBack::WrongSize(size) => Freed::WrongSize(size),
        }
    }

    /// The size of the live large block at `ptr`, if there is one.
    pub(super) fn large_size(&self, ptr: usize) -> Option<usize> {
        match self.heap.taken_at(ptr) {
            Some((size, LARGE)) => Some(size),
            _ => None,
        }
    }

    /// The range taken from the upstream: (base, size).
    pub(super) fn extent(&self) -> (usize, usize) {
        (self.base, self.size)
    }

    /// Free bytes in the global arena.
    pub(super) fn free_bytes(&self) -> usize {
        self.heap.free_bytes()
    }

    /// Number of free ranges.
    #[cfg(test)]
    pub(super) fn free_count(&self) -> usize {
        self.heap.free_count()
    }

    /// The largest free range.
    pub(super) fn largest_free(&self) -> usize {
        self.heap.largest_free()
    }

    /// The free ranges in address order, as (start, length).
    pub(super) fn free_ranges(&self) -> Vec<(usize, usize)> {
        self.heap.free_ranges()
    }

    /// The live large blocks as (start, length), in address order.
    pub(super) fn large_ranges(&self) -> Vec<(usize, usize)> {
        self.heap.taken_ranges(LARGE)
    }

    /// Number of live large blocks and the bytes they hold.
    pub(super) fn large_blocks(&self) -> (usize, usize) {
        self.large
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
        assert_eq!(g.free_ranges(), vec![(BASE, 3 * MIB + MIB / 2)]);
        assert_eq!(g.extent(), (BASE, 3 * MIB + MIB / 2));
        g.heap.check();
    }

    #[test]
    fn large_blocks_are_served_directly_and_checked_on_free() {
        let mut g = GlobalArena::new(BASE, 8 * MIB);
        let a = g.allocate_large(2 * MIB + 256).unwrap();
        let b = g.allocate_large(3 * MIB).unwrap();
        assert_eq!((a, b), (BASE, BASE + 2 * MIB + 256));
        let sb = g.acquire(256).unwrap();
        assert_eq!(g.large_blocks(), (2, 5 * MIB + 256));
        assert_eq!(g.large_size(a), Some(2 * MIB + 256));
        assert_eq!(g.large_size(sb.0), None, "a superblock is no large block");
        assert_eq!(g.deallocate_large(sb.0, sb.1), Freed::NotHere);
        assert_eq!(
            g.deallocate_large(a, 2 * MIB),
            Freed::WrongSize(2 * MIB + 256)
        );
        assert_eq!(g.deallocate_large(a + 256, 2 * MIB), Freed::NotHere);
        assert_eq!(g.deallocate_large(a, 2 * MIB + 256), Freed::Done);
        assert_eq!(g.deallocate_large(a, 2 * MIB + 256), Freed::NotHere);
        g.release(sb.0, sb.1);
        // Free: 2 MiB + 256 at the front, 3 MiB - 256 at the end: a 2.5 MiB block fits either.
        let c = g.allocate_large(5 * MIB / 2).unwrap();
        assert!(c == BASE || c == BASE + 5 * MIB + 256, "{c:#x}");
        assert_eq!(g.large_blocks(), (2, 3 * MIB + 5 * MIB / 2));
        assert_eq!(g.free_bytes(), 8 * MIB - 3 * MIB - 5 * MIB / 2);
        assert_eq!(g.deallocate_large(b, 3 * MIB), Freed::Done);
        assert_eq!(g.deallocate_large(c, 5 * MIB / 2), Freed::Done);
        assert_eq!(g.free_bytes(), 8 * MIB);
        assert_eq!(g.largest_free(), 8 * MIB);
        assert_eq!(g.free_count(), 1);
        g.heap.check();
    }
}
