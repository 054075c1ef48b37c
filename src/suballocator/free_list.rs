//! What a suballocation strategy plugs into the stream-ordered core: one [`FreeList`] instance
//! per stream (plus one for fresh memory), each a pure bookkeeping structure over addresses.

#![deny(unsafe_code)]

use crate::error::Result;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Index of a stream's free list in a core; dense, assigned in order of first use.
pub(crate) type ListId = u32;

/// The id of the list of memory fresh from the upstream, which belongs to no stream.
pub(crate) const FRESH: ListId = 0;

/// A range of memory handed out or held free: `[addr, addr + size)` inside growth region
/// `region`. Blocks coalesce only with blocks of the same region (for the pool, one region per
/// upstream chunk; a strategy that extends one address range gives every extension one region).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Block {
    /// First address.
    pub addr: usize,
    /// Bytes.
    pub size: usize,
    /// The growth region the block lies in.
    pub region: usize,
}

impl Block {
    /// One past the last address.
    #[inline]
    pub fn end(&self) -> usize {
        self.addr + self.size
    }
}

/// One free list of a suballocation strategy: how a block is carved from it and how a freed one
/// goes back. Pure bookkeeping on addresses; no CUDA calls, no locks (the core locks it).
// `remove_range` and `free_ranges` serve trimming growth policies (the expandable pool's).
#[allow(dead_code)]
pub(crate) trait FreeList: Send + Sized + 'static {
    /// The strategy's fixed parameters, shared by every list of one core.
    type Sizing: Send + Sync + std::fmt::Debug + 'static;

    /// An empty list.
    fn new(sizing: &Self::Sizing) -> Self;

    /// The block size handed out for a request of `bytes` (> 0).
    ///
    /// # Errors
    /// Out of memory for a request this strategy can never serve.
    fn block_size_for(sizing: &Self::Sizing, bytes: usize) -> Result<usize>;

    /// Whether [`FreeList::take`] would succeed.
    fn can_take(&self, size: usize) -> bool;

    /// Takes a block of `size` bytes (as from [`FreeList::block_size_for`]).
    fn take(&mut self, size: usize) -> Option<Block>;

    /// Puts a free block (one taken earlier, from this or another list) into the list,
    /// coalescing with its free neighbours of the same region where the strategy does.
    fn insert(&mut self, block: Block);

    /// Adds a chunk fresh from the upstream (the default: as one free block).
    fn add_chunk(&mut self, chunk: Block) {
        self.insert(chunk);
    }

    /// Takes every free block out of the list.
    fn drain(&mut self) -> Vec<Block>;

    /// Moves the blocks of `fresh` that border a free block of this list (same region) into
    /// this list, coalesced; whether any moved. The default moves nothing (no coalescing).
    fn absorb_bordering(&mut self, fresh: &mut Self) -> bool {
        let _ = fresh;
        false
    }

    /// Takes exactly the free block `block` out of the list, if it is one; whether it was. The
    /// default never does (a strategy whose chunks never go back before it drops).
    fn remove_block(&mut self, block: Block) -> bool {
        let _ = block;
        false
    }

    /// Takes `[addr, addr + size)` out of the free block that contains it, splitting that
    /// block; whether one did. The default never does (a strategy that cannot trim).
    fn remove_range(&mut self, addr: usize, size: usize) -> bool {
        let _ = (addr, size);
        false
    }

    /// Every free block (for reports and trimming).
    fn free_ranges(&self) -> Vec<Block>;

    /// Free bytes in the list.
    fn free_bytes(&self) -> usize;

    /// Free blocks in the list.
    fn free_blocks(&self) -> usize;

    /// The largest free block.
    fn largest_free_block(&self) -> usize;
}

/// Hashes block addresses (multiples of 256) with one folded multiply.
#[derive(Default, Clone, Copy)]
pub(crate) struct AddressHasher(u64);

impl Hasher for AddressHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
        self.write_u64(0);
    }
    #[inline]
    fn write_u64(&mut self, x: u64) {
        let p = u128::from(x ^ self.0).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = (p as u64) ^ ((p >> 64) as u64);
    }
    #[inline]
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
}

/// A hash map keyed by addresses (or other integers) with [`AddressHasher`].
pub(crate) type AddressMap<K, V> = HashMap<K, V, BuildHasherDefault<AddressHasher>>;
