//! A per-thread or per-stream arena: the superblocks it took from the global arena, and its live
//! blocks.
//!
//! Pure bookkeeping: addresses and sizes on the host, no CUDA, no `unsafe`. The resource wraps
//! each one in its own lock.

use super::superblock::Superblock;
use std::collections::{BTreeMap, BTreeSet};

/// A map keyed by block address, with the crate's one address hasher ([`crate::live`]).
pub(super) type AddressMap<V> = crate::live::AddressMap<usize, V>;

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
    /// Superblocks by start address.
    superblocks: BTreeMap<usize, Superblock>,
    /// (largest free block, start) of every superblock: which one a request goes to.
    fit: BTreeSet<(usize, usize)>,
    /// Live blocks: start -> rounded size.
    live: AddressMap<usize>,
    /// Counts frees; each superblock remembers the count at its latest free.
    seq: u64,
}

impl LocalArena {
    /// Allocates `bytes` (a multiple of 256, at most a superblock) from the superblock whose
    /// largest free block fits most tightly (lowest address on ties), by address-ordered first
    /// fit inside it; `None` when none fits. (RMM scans its superblocks in address order; with
    /// thousands of superblocks that scan dominated replays, so rrmm indexes them by their
    /// largest free block.)
    ///
    /// # Time Complexity
    /// O(log superblocks) to pick the superblock, plus O(free blocks) of that one.
    pub(super) fn allocate(&mut self, bytes: usize) -> Option<usize> {
        let &(before, start) = self.fit.range((bytes, 0)..).next()?;
        let sb = self.superblocks.get_mut(&start)?;
        let ptr = sb.first_fit(bytes)?;
        let after = sb.largest_free();
        if after != before {
            self.fit.remove(&(before, start));
            self.fit.insert((after, start));
        }
        self.live.insert(ptr, bytes);
        Some(ptr)
    }

    /// Adopts a free superblock `[start, start + size)` from the global arena and allocates
    /// `bytes` from it.
    pub(super) fn adopt_and_allocate(
        &mut self,
        start: usize,
        size: usize,
        bytes: usize,
    ) -> Option<usize> {
        let mut sb = Superblock::new(start, size, self.seq);
        let ptr = sb.first_fit(bytes);
        self.fit.insert((sb.largest_free(), start));
        self.superblocks.insert(start, sb);
        let ptr = ptr?;
        self.live.insert(ptr, bytes);
        Some(ptr)
    }

    /// Frees the live block at `ptr` of `bytes` (rounded), coalescing it in its superblock.
    ///
    /// # Time Complexity
    /// O(log superblocks + log free blocks).
    pub(super) fn deallocate(&mut self, ptr: usize, bytes: usize) -> Freed {
        match self.live.get(&ptr) {
            None => return Freed::NotHere,
            Some(&size) if size != bytes => return Freed::WrongSize(size),
            Some(_) => {}
        }
        self.live.remove(&ptr);
        self.seq += 1;
        let seq = self.seq;
        match self.superblocks.range_mut(..=ptr).next_back() {
            Some((&start, sb)) if sb.contains(ptr, bytes) => {
                let before = sb.largest_free();
                sb.free(ptr, bytes, seq);
                let after = sb.largest_free();
                if after != before {
                    self.fit.remove(&(before, start));
                    self.fit.insert((after, start));
                }
                Freed::Done
            }
            // A live block always lies in one of its arena's superblocks.
            _ => Freed::NotHere,
        }
    }

    /// The free counter now (see [`LocalArena::take_idle`]).
    pub(super) fn seq(&self) -> u64 {
        self.seq
    }

    /// Removes and returns, as (start, size), every empty superblock whose latest free came at
    /// or before free number `seq` (frees after it may have work still pending on their stream).
    pub(super) fn take_idle(&mut self, seq: u64) -> Vec<(usize, usize)> {
        let idle: Vec<usize> = self
            .superblocks
            .values()
            .filter(|sb| sb.is_empty() && sb.last_free_seq <= seq)
            .map(Superblock::start)
            .collect();
        idle.into_iter()
            .filter_map(|start| self.superblocks.remove(&start))
            .map(|sb| {
                self.fit.remove(&(sb.largest_free(), sb.start()));
                (sb.start(), sb.size())
            })
            .collect()
    }

    /// Whether this arena holds no superblock.
    pub(super) fn is_bare(&self) -> bool {
        self.superblocks.is_empty()
    }

    /// Bytes held in superblocks.
    pub(super) fn held_bytes(&self) -> usize {
        self.superblocks.values().map(Superblock::size).sum()
    }

    /// Free bytes in the superblocks.
    pub(super) fn free_bytes(&self) -> usize {
        self.superblocks.values().map(Superblock::free_bytes).sum()
    }

    /// Number of live blocks.
    pub(super) fn live_blocks(&self) -> usize {
        self.live.len()
    }

    /// The superblocks in address order.
    pub(super) fn superblocks(&self) -> impl Iterator<Item = &Superblock> + '_ {
        self.superblocks.values()
    }
}

#[cfg(test)]
mod tests {
    use super::super::superblock::SUPERBLOCK_MIN as MIB;
    use super::*;

    #[test]
    fn allocates_first_fit_over_superblocks_and_knows_its_blocks() {
        let mut a = LocalArena::default();
        assert_eq!(a.allocate(256), None, "no superblock yet");
        let p = a.adopt_and_allocate(0x100_0000, MIB, MIB / 2).unwrap();
        assert_eq!(p, 0x100_0000);
        let q = a.adopt_and_allocate(0x300_0000, MIB, MIB).unwrap();
        // Fits in the first superblock's tail, not the second.
        assert_eq!(a.allocate(MIB / 4), Some(0x100_0000 + MIB / 2));
        assert_eq!(a.live_blocks(), 3);
        assert_eq!(a.deallocate(q, 256), Freed::WrongSize(MIB));
        assert_eq!(a.deallocate(q + 256, 256), Freed::NotHere);
        assert_eq!(a.deallocate(q, MIB), Freed::Done);
        assert_eq!(a.deallocate(q, MIB), Freed::NotHere, "double free");
        assert_eq!(a.held_bytes(), 2 * MIB);
        assert_eq!(a.free_bytes(), MIB + MIB / 4);
    }

    #[test]
    fn take_idle_skips_superblocks_freed_into_after_the_snapshot() {
        let mut a = LocalArena::default();
        let p = a.adopt_and_allocate(0, MIB, 256).unwrap();
        let q = a.adopt_and_allocate(MIB, MIB, 256).unwrap();
        assert_eq!(a.deallocate(p, 256), Freed::Done);
        let snapshot = a.seq();
        assert_eq!(a.deallocate(q, 256), Freed::Done);
        assert_eq!(a.take_idle(snapshot), vec![(0, MIB)]);
        assert_eq!(a.take_idle(a.seq()), vec![(MIB, MIB)]);
        assert!(a.is_bare());
    }
}
