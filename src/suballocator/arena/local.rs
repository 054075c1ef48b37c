//! A per-thread or per-stream arena: the superblocks it took from the global arena, and its live
//! blocks.
//!
//! Pure bookkeeping: addresses and sizes on the host, no CUDA, no `unsafe`. The resource wraps
//! each one in its own lock.

use super::superblock::Superblock;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

/// A hasher for 256-byte-aligned addresses: one multiply (SipHash showed up as a tenth of the
/// arena's time). Not for untrusted keys; the keys here are the arena's own addresses.
#[derive(Default, Clone, Copy)]
pub(super) struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = ((self.0 << 8) | u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = ((n as u64) >> 8).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A map keyed by block address.
pub(super) type AddressMap<V> = HashMap<usize, V, BuildHasherDefault<AddressHasher>>;

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
    /// Live blocks: start -> rounded size.
    live: AddressMap<usize>,
    /// Counts frees; each superblock remembers the count at its latest free.
    seq: u64,
}

impl LocalArena {
    /// Allocates `bytes` (a multiple of 256, at most a superblock) by address-ordered first fit
    /// over the superblocks; `None` when none fits.
    ///
    /// # Time Complexity
    /// O(superblocks) to find the first that fits (a cached figure each), plus O(free blocks)
    /// of that one.
    pub(super) fn allocate(&mut self, bytes: usize) -> Option<usize> {
        let ptr = self
            .superblocks
            .values_mut()
            .filter(|sb| sb.largest_free() >= bytes)
            .find_map(|sb| sb.first_fit(bytes))?;
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
            Some((_, sb)) if sb.contains(ptr, bytes) => {
                sb.free(ptr, bytes, seq);
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
            .map(|sb| (sb.start(), sb.size()))
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
