//! What a suballocation strategy plugs into the stream-ordered core: one [`FreeList`] instance
//! per stream (plus one for fresh memory), each a pure bookkeeping structure over addresses.

#![deny(unsafe_code)]

use crate::error::Result;

/// Index of a stream's free list in a core; dense, assigned in order of first use.
pub(super) type ListId = u32;

/// The id of the list of memory fresh from the upstream, which belongs to no stream.
pub(super) const FRESH: ListId = 0;

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

/// What a list found when asked for the block allocated through it at an address for a request
/// of some size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Found<T> {
    /// The block was there, the one the request gets (and was acted on).
    Yes(T),
    /// No block allocated through this list starts at the address.
    No,
    /// The block there has this size, not the request's (nothing changed).
    OtherSize(usize),
}

impl<T> Found<T> {
    /// The same finding with `f` applied to what was found.
    #[inline]
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Found<U> {
        match self {
            Found::Yes(t) => Found::Yes(f(t)),
            Found::No => Found::No,
            Found::OtherSize(size) => Found::OtherSize(size),
        }
    }
}

/// One list of a suballocation strategy: its free blocks, and the blocks allocated through it
/// (so that a free finds its block, and a bogus or double free or one with another size is
/// caught). How a block is carved from it and how a freed one goes back. Pure bookkeeping on
/// addresses; no CUDA calls, no locks (the core locks it).
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

    /// Takes a free block of `size` bytes (as from [`FreeList::block_size_for`]) out of the
    /// list entirely (for another list to [`FreeList::adopt`]).
    fn take(&mut self, size: usize) -> Option<Block>;

    /// Takes a free block of `size` bytes and records it as allocated in this list; its address.
    fn take_allocated(&mut self, size: usize) -> Option<usize> {
        let block = self.take(size)?;
        self.adopt(block);
        Some(block.addr)
    }

    /// Records `block` (taken from another list) as allocated in this list.
    fn adopt(&mut self, block: Block);

    /// Frees the block allocated in this list at `addr` for a request of `bytes` into this list
    /// (coalescing where the strategy does); its size. Changes nothing when no block allocated
    /// here starts there, or when the one that does is not the block a request of `bytes` gets
    /// (another size: [`Found::OtherSize`]).
    fn free_allocated(&mut self, addr: usize, bytes: usize) -> Found<usize>;

    /// The blocks allocated in this list and not freed yet (for snapshots).
    fn allocated_blocks(&self) -> Vec<Block>;

    /// The size of the block allocated in this list (and not freed) that starts at `addr`, if
    /// any; O(1).
    fn allocated_size_at(&self, addr: usize) -> Option<usize>;

    /// The block allocated in this list (and not freed) that holds `addr`, as (start, size);
    /// O(blocks allocated here) (for rare lookups of an interior address: a view's).
    fn allocated_block_holding(&self, addr: usize) -> Option<(usize, usize)> {
        self.allocated_blocks()
            .into_iter()
            .find(|b| b.addr <= addr && addr - b.addr < b.size)
            .map(|b| (b.addr, b.size))
    }

    /// Drops the record of the block allocated in this list at `addr` for a request of `bytes`
    /// and returns it (for a free on another stream); changes nothing when [`Self::free_allocated`]
    /// would not free it.
    fn forget(&mut self, addr: usize, bytes: usize) -> Found<Block>;

    /// Puts a free block (one taken or forgotten by this or another list) into the list,
    /// coalescing with its free neighbours of the same region where the strategy does.
    fn insert(&mut self, block: Block);

    /// Adds a chunk fresh from the upstream (the default: as one free block).
    fn add_chunk(&mut self, chunk: Block) {
        self.insert(chunk);
    }

    /// Takes every free block out of the list (allocated ones stay recorded).
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

    /// Every free block, by address (for reports and trimming).
    fn free_ranges(&self) -> Vec<Block>;

    /// The free blocks of at least `min` bytes, by address (a trim of whole pages needs no
    /// smaller one). The default filters [`FreeList::free_ranges`].
    fn free_ranges_at_least(&self, min: usize) -> Vec<Block> {
        let mut out = self.free_ranges();
        out.retain(|b| b.size >= min);
        out
    }

    /// The free block that ends at `end`, if one does. The default looks through
    /// [`FreeList::free_ranges`].
    fn free_block_ending_at(&self, end: usize) -> Option<Block> {
        self.free_ranges().into_iter().find(|b| b.end() == end)
    }

    /// Free bytes in the list.
    fn free_bytes(&self) -> usize;

    /// Free blocks in the list.
    fn free_blocks(&self) -> usize;

    /// The largest free block.
    fn largest_free_block(&self) -> usize;

    /// Whether free neighbours of one region coalesce (then free blocks of different lists that
    /// touch are one free region: the synchronize-and-merge of a failing request joins them, so
    /// the figures count them as one).
    const COALESCES: bool = false;
}

/// The crate's one address-keyed map (see [`crate::live`]).
pub(crate) use crate::live::AddressMap;
