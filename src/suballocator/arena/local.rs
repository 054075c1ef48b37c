//! A per-thread or per-stream arena: the superblocks it took from the global arena, and its live
//! blocks.
//!
//! Pure bookkeeping: addresses and sizes on the host, no CUDA, no `unsafe`. The resource wraps
//! each one in its own lock. Every superblock is one region of the arena's [`RangeHeap`], so
//! blocks are carved by its good fit over all the superblocks and coalesce only inside their
//! own; the heap's taken ranges are the live blocks.

use super::ranges::{GiveBack, RangeHeap};
use super::superblock::{Superblock, SuperblockReport};
use crate::resource::sleep::ByteRange;
use crate::suballocator::core::ListCounters;

/// The heap tag of a live block.
const BLOCK: u8 = 0;

/// What a free found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Freed {
    /// The block was live here and is free now.
    Done,
    /// No live block starts at that address here.
    NotHere,
    /// A live block starts there, but with another size (the caller's size is wrong).
    WrongSize(usize),
}

/// One arena's superblocks and live blocks.
#[derive(Debug, Default)]
pub(super) struct LocalArena {
    heap: RangeHeap,
    /// Superblocks by region id (a slot is empty once its superblock went back).
    superblocks: Vec<Option<Superblock>>,
    /// Empty slots of `superblocks`.
    spare: Vec<u32>,
    /// Counts frees; each superblock remembers the count at its latest free.
    seq: u64,
    /// Its allocations' figures (`memory_stats`).
    pub(super) counters: ListCounters,
}

impl LocalArena {
    /// Allocates `bytes` (a multiple of 256, at most a superblock) from any superblock by the
    /// heap's good fit; `None` when none has a free block that large.
    ///
    /// # Time Complexity
    /// O(1).
    #[inline]
    pub(super) fn allocate(&mut self, bytes: usize) -> Option<usize> {
        let ptr = self.heap.take(bytes, 1, BLOCK).map(|t| t.start)?;
        self.counters.allocated(bytes);
        Some(ptr)
    }

    /// Adopts a free superblock `[start, start + size)` from the global arena and allocates
    /// `bytes` at its start (`None` when `bytes` exceeds `size`).
    pub(super) fn adopt_and_allocate(
        &mut self,
        start: usize,
        size: usize,
        bytes: usize,
    ) -> Option<usize> {
        let slot = match self.spare.pop() {
            Some(slot) => slot,
            None => {
                self.superblocks.push(None);
                (self.superblocks.len() - 1) as u32
            }
        };
        let first = self.heap.add_region(start, size, slot);
        self.superblocks[slot as usize] = Some(Superblock {
            start,
            size,
            first,
            last_free_seq: self.seq,
        });
        let ptr = self.heap.take_from(first, bytes, BLOCK).map(|t| t.start)?;
        self.counters.allocated(bytes);
        Some(ptr)
    }

    /// Frees the live block at `ptr` of `bytes` (rounded), coalescing it in its superblock.
    ///
    /// # Time Complexity
    /// O(1).
    #[inline]
    pub(super) fn deallocate(&mut self, ptr: usize, bytes: usize) -> Freed {
        match self.heap.give_back(ptr, bytes, BLOCK) {
            GiveBack::Done(region) => {
                self.counters.freed(bytes);
                self.seq += 1;
                if let Some(Some(sb)) = self.superblocks.get_mut(region as usize) {
                    sb.last_free_seq = self.seq;
                }
                Freed::Done
            }
            GiveBack::NotHere => Freed::NotHere,
            GiveBack::WrongSize(size) => Freed::WrongSize(size),
        }
    }

    /// The rounded size of the live block at `ptr`, if there is one here.
    pub(super) fn live_size(&self, ptr: usize) -> Option<usize> {
        self.heap.taken_at(ptr).map(|(size, _)| size)
    }

    /// The free counter now (see [`LocalArena::take_idle`]).
    pub(super) fn seq(&self) -> u64 {
        self.seq
    }

    /// Removes and returns, as (start, size), every empty superblock whose latest free came at
    /// or before free number `seq` (frees after it may have work still pending on their stream).
    ///
    /// # Time Complexity
    /// O(superblocks).
    pub(super) fn take_idle(&mut self, seq: u64) -> Vec<(usize, usize)> {
        let mut idle = Vec::new();
        for (slot, entry) in self.superblocks.iter_mut().enumerate() {
            let Some(sb) = *entry else { continue };
            if sb.last_free_seq <= seq && self.heap.is_whole_and_free(sb.first, sb.size) {
                self.heap.remove_region(sb.first);
                *entry = None;
                self.spare.push(slot as u32);
                idle.push((sb.start, sb.size));
            }
        }
        idle.sort_unstable();
        idle
    }

    /// Whether this arena holds no superblock.
    pub(super) fn is_bare(&self) -> bool {
        self.spare.len() == self.superblocks.len()
    }

    /// Bytes held in superblocks.
    pub(super) fn held_bytes(&self) -> usize {
        self.superblocks.iter().flatten().map(|sb| sb.size).sum()
    }

    /// Free bytes in the superblocks.
    pub(super) fn free_bytes(&self) -> usize {
        self.heap.free_bytes()
    }

    /// The live blocks and the free ranges as (start, length), each in address order.
    pub(super) fn blocks(&self) -> (Vec<ByteRange>, Vec<ByteRange>) {
        (self.heap.taken_ranges(BLOCK), self.heap.free_ranges())
    }

    /// Number of live blocks.
    pub(super) fn live_blocks(&self) -> usize {
        self.heap.taken_count()
    }

    /// Every superblock's figures, in address order.
    ///
    /// # Time Complexity
    /// O(blocks + superblocks x log superblocks).
    pub(super) fn superblocks(&self) -> Vec<SuperblockReport> {
        let mut out: Vec<SuperblockReport> = self
            .superblocks
            .iter()
            .flatten()
            .map(|sb| {
                let (free_bytes, free_blocks, largest_free) = self.heap.region_free(sb.first);
                SuperblockReport {
                    start: sb.start,
                    size: sb.size,
                    free_bytes,
                    free_blocks,
                    largest_free,
                }
            })
            .collect();
        out.sort_unstable_by_key(|r| r.start);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::superblock::SUPERBLOCK_MIN as MIB;
    use super::*;

    #[test]
    fn allocates_over_superblocks_and_knows_its_blocks() {
        let mut a = LocalArena::default();
        assert_eq!(a.allocate(256), None, "no superblock yet");
        let p = a.adopt_and_allocate(0x100_0000, MIB, MIB / 2).unwrap();
        assert_eq!(p, 0x100_0000);
        let q = a.adopt_and_allocate(0x300_0000, MIB, MIB).unwrap();
        assert_eq!(q, 0x300_0000);
        // Only the first superblock's tail has room.
        assert_eq!(a.allocate(MIB / 4), Some(0x100_0000 + MIB / 2));
        assert_eq!(a.live_blocks(), 3);
        assert_eq!(a.live_size(q), Some(MIB));
        assert_eq!(a.deallocate(q, 256), Freed::WrongSize(MIB));
        assert_eq!(a.deallocate(q + 256, 256), Freed::NotHere);
        assert_eq!(a.deallocate(q, MIB), Freed::Done);
        assert_eq!(a.deallocate(q, MIB), Freed::NotHere, "double free");
        assert_eq!(a.held_bytes(), 2 * MIB);
        assert_eq!(a.free_bytes(), MIB + MIB / 4);
        let reports = a.superblocks();
        assert_eq!(reports.len(), 2);
        assert_eq!(
            reports[0],
            SuperblockReport {
                start: 0x100_0000,
                size: MIB,
                free_bytes: MIB / 4,
                free_blocks: 1,
                largest_free: MIB / 4,
            }
        );
        assert!(reports[1].is_empty() && !reports[0].is_empty());
        a.heap.check();
    }

    #[test]
    fn take_idle_skips_superblocks_freed_into_after_the_snapshot() {
        let mut a = LocalArena::default();
        let p = a.adopt_and_allocate(0, MIB, 256).unwrap();
        let q = a.adopt_and_allocate(MIB, MIB, 256).unwrap();
        assert_eq!((p, q), (0, MIB), "each at its new superblock's start");
        assert_eq!(a.deallocate(p, 256), Freed::Done);
        let snapshot = a.seq();
        assert_eq!(a.deallocate(q, 256), Freed::Done);
        assert_eq!(a.take_idle(snapshot), vec![(0, MIB)]);
        assert_eq!(a.take_idle(a.seq()), vec![(MIB, MIB)]);
        assert!(a.is_bare());
        // Slots are reused.
        assert_eq!(a.adopt_and_allocate(5 * MIB, MIB, 512), Some(5 * MIB));
        assert_eq!(a.adopt_and_allocate(6 * MIB, MIB, MIB + 256), None);
        assert_eq!(a.superblocks.len(), 2);
        assert!(!a.is_bare());
        a.heap.check();
    }
}
