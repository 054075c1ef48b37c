//! A superblock: a range of at least [`SUPERBLOCK_MIN`] bytes that one arena owns, carved into
//! blocks by address-ordered first fit, with free blocks coalesced on free.
//!
//! Pure bookkeeping: addresses and sizes on the host, no CUDA, no `unsafe`.

use std::collections::BTreeMap;

/// Smallest superblock, in bytes (1 MiB, as RMM's); requests above it are served by the global
/// arena directly.
pub const SUPERBLOCK_MIN: usize = 1 << 20;

/// One superblock and its free blocks.
#[derive(Debug, Clone)]
pub(super) struct Superblock {
    start: usize,
    size: usize,
    /// Free blocks by address: start -> length; never two adjacent (they are coalesced).
    free: BTreeMap<usize, usize>,
    free_bytes: usize,
    /// The largest free block (kept so that arenas skip superblocks that cannot fit in O(1)).
    largest: usize,
    /// The owning arena's free counter at the latest free into this superblock (see
    /// `LocalArena::take_idle`).
    pub(super) last_free_seq: u64,
}

impl Superblock {
    /// A wholly free superblock over `[start, start + size)`.
    pub(super) fn new(start: usize, size: usize, seq: u64) -> Self {
        let mut free = BTreeMap::new();
        free.insert(start, size);
        Superblock {
            start,
            size,
            free,
            free_bytes: size,
            largest: size,
            last_free_seq: seq,
        }
    }

    pub(super) fn start(&self) -> usize {
        self.start
    }

    pub(super) fn size(&self) -> usize {
        self.size
    }

    pub(super) fn free_bytes(&self) -> usize {
        self.free_bytes
    }

    /// Whether every byte is free.
    pub(super) fn is_empty(&self) -> bool {
        self.free_bytes == self.size
    }

    /// Whether `[ptr, ptr + bytes)` lies inside this superblock.
    pub(super) fn contains(&self, ptr: usize, bytes: usize) -> bool {
        ptr >= self.start && ptr.saturating_add(bytes) <= self.start + self.size
    }

    /// Number of free blocks.
    pub(super) fn free_blocks(&self) -> usize {
        self.free.len()
    }

    /// The largest free block.
    pub(super) fn largest_free(&self) -> usize {
        self.largest
    }

    /// Takes the lowest-addressed free block of at least `bytes` and returns its start; the rest
    /// of that block stays free.
    ///
    /// # Time Complexity
    /// O(1) when no block fits; else O(free blocks) to find it (and to find the new largest
    /// block when it was the largest).
    pub(super) fn first_fit(&mut self, bytes: usize) -> Option<usize> {
        if bytes == 0 || bytes > self.largest {
            return None;
        }
        let (&start, &len) = self.free.iter().find(|(_, &len)| len >= bytes)?;
        self.free.remove(&start);
        if len > bytes {
            self.free.insert(start + bytes, len - bytes);
        }
        self.free_bytes -= bytes;
        if len == self.largest {
            self.largest = self.free.values().copied().max().unwrap_or(0);
        }
        Some(start)
    }

    /// Returns `[ptr, ptr + bytes)`, which the caller knows is allocated from this superblock,
    /// merging it with free neighbours.
    ///
    /// # Time Complexity
    /// O(log free blocks).
    pub(super) fn free(&mut self, ptr: usize, bytes: usize, seq: u64) {
        debug_assert!(self.contains(ptr, bytes));
        let mut start = ptr;
        let mut len = bytes;
        if let Some((&prev, &prev_len)) = self.free.range(..ptr).next_back() {
            debug_assert!(prev + prev_len <= ptr, "freeing a free block");
            if prev + prev_len == ptr {
                self.free.remove(&prev);
                start = prev;
                len += prev_len;
            }
        }
        if let Some(next_len) = self.free.remove(&(ptr + bytes)) {
            len += next_len;
        }
        self.free.insert(start, len);
        self.largest = self.largest.max(len);
        self.free_bytes += bytes;
        self.last_free_seq = seq;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = SUPERBLOCK_MIN;

    #[test]
    fn first_fit_takes_the_lowest_address_and_free_coalesces_both_sides() {
        let mut sb = Superblock::new(0x10_0000, MIB, 0);
        let a = sb.first_fit(256).unwrap();
        let b = sb.first_fit(512).unwrap();
        let c = sb.first_fit(256).unwrap();
        assert_eq!((a, b, c), (0x10_0000, 0x10_0100, 0x10_0300));
        assert_eq!(sb.free_bytes(), MIB - 1024);
        sb.free(a, 256, 1);
        sb.free(c, 256, 2);
        assert_eq!(sb.free_blocks(), 2, "a and c+tail are free, b between them");
        // First fit: a 256-byte request goes to the hole at `a`, not the tail.
        assert_eq!(sb.first_fit(256), Some(a));
        sb.free(a, 256, 3);
        sb.free(b, 512, 4);
        assert!(sb.is_empty());
        assert_eq!(sb.free_blocks(), 1);
        assert_eq!(sb.largest_free(), MIB);
        assert_eq!(sb.last_free_seq, 4);
    }

    #[test]
    fn requests_larger_than_any_free_block_fail() {
        let mut sb = Superblock::new(0, MIB, 0);
        assert_eq!(sb.first_fit(MIB + 256), None);
        assert_eq!(sb.first_fit(0), None);
        let half = sb.first_fit(MIB / 2).unwrap();
        let _q = sb.first_fit(MIB / 4).unwrap();
        sb.free(half, MIB / 2, 1);
        // Free: MIB/2 at the front and MIB/4 at the back, but not MIB*3/4 in one piece.
        assert_eq!(sb.free_bytes(), MIB * 3 / 4);
        assert_eq!(sb.first_fit(MIB * 3 / 4), None);
        assert!(sb.contains(half, MIB / 2) && !sb.contains(MIB - 256, 512));
    }
}
