//! A superblock: a range of at least [`SUPERBLOCK_MIN`] bytes that one arena took from the
//! global arena, one region of the arena's [`RangeHeap`](super::ranges::RangeHeap).
//!
//! Pure bookkeeping: addresses and sizes on the host, no CUDA, no `unsafe`.

/// Smallest superblock, in bytes (1 MiB, as RMM's); requests above it are served by the global
/// arena directly.
pub const SUPERBLOCK_MIN: usize = 1 << 20;

/// One superblock of an arena.
#[derive(Debug, Clone, Copy)]
pub(super) struct Superblock {
    /// First address.
    pub start: usize,
    /// Bytes.
    pub size: usize,
    /// The id of its first range in the arena's heap (stable, see the heap's docs).
    pub first: u32,
    /// The owning arena's free counter at the latest free into this superblock (see
    /// `LocalArena::take_idle`).
    pub last_free_seq: u64,
}

/// A superblock's figures, for reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SuperblockReport {
    /// First address.
    pub start: usize,
    /// Bytes.
    pub size: usize,
    /// Free bytes.
    pub free_bytes: usize,
    /// Free blocks (coalesced).
    pub free_blocks: usize,
    /// The largest free block.
    pub largest_free: usize,
}

impl SuperblockReport {
    /// Whether every byte is free.
    pub(super) fn is_empty(&self) -> bool {
        self.free_bytes == self.size
    }
}
