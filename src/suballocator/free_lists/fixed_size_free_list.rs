//! The fixed-size strategy: every block has one size; each free list is a stack.
//!
//! # Time Complexity
//! `take` and `insert` are O(1); `add_chunk` is O(blocks in the chunk); draining is O(free
//! blocks).

#![deny(unsafe_code)]

use crate::error::{Error, Result};
use crate::suballocator::core::{AddressMap, Block, Found, FreeList};

/// A stack of equal free blocks, and the set of blocks allocated through the list. Blocks never
/// coalesce and chunks are never given back before the resource drops (as RMM's
/// `fixed_size_memory_resource`), so the list keeps addresses only.
#[derive(Debug)]
pub(crate) struct FixedSizeFreeList {
    block_size: usize,
    stack: Vec<usize>,
    allocated: AddressMap<usize, ()>,
}

impl FixedSizeFreeList {
    /// Drops the record of the block allocated at `addr` when a request of `bytes` gets a
    /// block (any size from 1 to the block size).
    #[inline]
    fn check(&mut self, addr: usize, bytes: usize) -> Found<()> {
        if bytes != 0 && bytes <= self.block_size {
            match self.allocated.remove(&addr) {
                Some(()) => Found::Yes(()),
                None => Found::No,
            }
        } else if self.allocated.contains_key(&addr) {
            Found::OtherSize(self.block_size)
        } else {
            Found::No
        }
    }
}

/// The block of `size` bytes at `addr` (fixed-size blocks have no growth region: 0).
#[inline]
fn block_at(addr: usize, size: usize) -> Block {
    Block {
        addr,
        size,
        region: 0,
    }
}

impl FreeList for FixedSizeFreeList {
    /// The block size (a multiple of 256, not 0).
    type Sizing = usize;

    fn new(block_size: &usize) -> Self {
        FixedSizeFreeList {
            block_size: *block_size,
            stack: Vec::new(),
            allocated: AddressMap::default(),
        }
    }

    fn block_size_for(block_size: &usize, bytes: usize) -> Result<usize> {
        if bytes > *block_size {
            return Err(Error::out_of_memory(
                bytes,
                format!(
                    "fixed_size_memory_resource: request larger than the block size of \
                     {block_size} bytes"
                ),
            ));
        }
        Ok(*block_size)
    }

    fn can_take(&self, _size: usize) -> bool {
        !self.stack.is_empty()
    }

    #[inline]
    fn take(&mut self, _size: usize) -> Option<Block> {
        let addr = self.stack.pop()?;
        Some(block_at(addr, self.block_size))
    }

    fn adopt(&mut self, block: Block) {
        self.allocated.insert(block.addr, ());
    }

    #[inline]
    fn free_allocated(&mut self, addr: usize, bytes: usize) -> Found<usize> {
        let found = self.check(addr, bytes);
        if found == Found::Yes(()) {
            self.stack.push(addr);
        }
        found.map(|()| self.block_size)
    }

    fn allocated_size_at(&self, addr: usize) -> Option<usize> {
        self.allocated
            .contains_key(&addr)
            .then_some(self.block_size)
    }

    fn allocated_blocks(&self) -> Vec<Block> {
        self.allocated
            .keys()
            .map(|&addr| block_at(addr, self.block_size))
            .collect()
    }

    fn forget(&mut self, addr: usize, bytes: usize) -> Found<Block> {
        let block_size = self.block_size;
        self.check(addr, bytes).map(|()| block_at(addr, block_size))
    }

    #[inline]
    fn insert(&mut self, block: Block) {
        self.stack.push(block.addr);
    }

    fn add_chunk(&mut self, chunk: Block) {
        let n = chunk.size / self.block_size;
        // Pushed from the top so that the lowest address is taken first.
        self.stack
            .extend((0..n).rev().map(|i| chunk.addr + i * self.block_size));
    }

    fn drain(&mut self) -> Vec<Block> {
        let size = self.block_size;
        self.stack
            .drain(..)
            .map(|addr| block_at(addr, size))
            .collect()
    }

    fn free_ranges(&self) -> Vec<Block> {
        self.stack
            .iter()
            .map(|&addr| block_at(addr, self.block_size))
            .collect()
    }

    fn free_bytes(&self) -> usize {
        self.stack.len() * self.block_size
    }

    fn free_blocks(&self) -> usize {
        self.stack.len()
    }

    fn largest_free_block(&self) -> usize {
        if self.stack.is_empty() {
            0
        } else {
            self.block_size
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_come_lowest_first_and_drain_whole() {
        let mut fresh = FixedSizeFreeList::new(&1024);
        let mut mine = FixedSizeFreeList::new(&1024);
        fresh.add_chunk(Block {
            addr: 0x4000,
            size: 4096,
            region: 0x4000,
        });
        assert_eq!(fresh.free_blocks(), 4);
        let a = fresh.take(1024).unwrap();
        assert_eq!((a.addr, a.size), (0x4000, 1024));
        mine.insert(a);
        assert!(mine.can_take(1) && fresh.free_bytes() + mine.free_bytes() == 4096);
        assert!(FixedSizeFreeList::block_size_for(&1024, 1025)
            .unwrap_err()
            .is_out_of_memory());
        for b in mine.drain() {
            fresh.insert(b);
        }
        assert!(!mine.can_take(1));
        assert_eq!(fresh.free_blocks(), 4);
        assert!(!fresh.remove_block(a), "fixed-size never gives chunks back");
        assert!(!mine.absorb_bordering(&mut fresh));
    }
}
