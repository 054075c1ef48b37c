//! The fixed-size strategy: every block has one size; per-stream free lists are stacks.
//!
//! # Time Complexity
//! `take` and `give_back` are O(1); `add_chunk` is O(blocks in the chunk); merging all lists is
//! O(free blocks).

#![deny(unsafe_code)]

use super::stream_ordered::{FreeList, ListId, FRESH};
use crate::error::{Error, Result};

/// Stacks of equal blocks, one per stream. Blocks never coalesce and chunks are never given
/// back before the resource drops (as RMM's `fixed_size_memory_resource`).
#[derive(Debug)]
pub(crate) struct FixedSizeFreeList {
    block_size: usize,
    lists: Vec<Vec<usize>>,
    free_blocks: usize,
}

impl FixedSizeFreeList {
    /// Empty lists of blocks of `block_size` bytes (a multiple of 256, not 0).
    pub(crate) fn new(block_size: usize) -> Self {
        FixedSizeFreeList {
            block_size,
            lists: vec![Vec::new()],
            free_blocks: 0,
        }
    }
}

impl FreeList for FixedSizeFreeList {
    fn block_size_for(&self, bytes: usize) -> Result<usize> {
        if bytes > self.block_size {
            return Err(Error::out_of_memory(
                bytes,
                format!(
                    "fixed_size_memory_resource: request larger than the block size of {} bytes",
                    self.block_size
                ),
            ));
        }
        Ok(self.block_size)
    }

    fn add_list(&mut self) -> ListId {
        self.lists.push(Vec::new());
        (self.lists.len() - 1) as ListId
    }

    fn can_take(&self, list: ListId, _size: usize) -> bool {
        self.lists.get(list as usize).is_some_and(|l| !l.is_empty())
    }

    #[inline]
    fn take(&mut self, list: ListId, _size: usize) -> Option<usize> {
        let ptr = self.lists.get_mut(list as usize)?.pop()?;
        self.free_blocks -= 1;
        Some(ptr)
    }

    #[inline]
    fn give_back(&mut self, list: ListId, addr: usize, _size: usize) -> Result<()> {
        let l = self
            .lists
            .get_mut(list as usize)
            .ok_or_else(|| Error::Logic(format!("no free list {list}")))?;
        l.push(addr);
        self.free_blocks += 1;
        Ok(())
    }

    fn add_chunk(&mut self, addr: usize, size: usize) {
        let n = size / self.block_size;
        let fresh = &mut self.lists[FRESH as usize];
        // Pushed from the top so that the lowest address is taken first.
        fresh.extend((0..n).rev().map(|i| addr + i * self.block_size));
        self.free_blocks += n;
    }

    fn absorb_fresh_neighbours(&mut self, _list: ListId) -> bool {
        false
    }

    fn merge_all_into_fresh(&mut self) {
        let mut all = std::mem::take(&mut self.lists[FRESH as usize]);
        for l in self.lists.iter_mut().skip(1) {
            all.append(l);
        }
        self.lists[FRESH as usize] = all;
    }

    fn remove_free_chunks(&mut self) -> Vec<(usize, usize)> {
        Vec::new()
    }

    fn free_bytes(&self) -> usize {
        self.free_blocks * self.block_size
    }

    fn free_blocks(&self) -> usize {
        self.free_blocks
    }

    fn largest_free_block(&self) -> usize {
        if self.free_blocks > 0 {
            self.block_size
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_come_lowest_first_and_stay_on_their_stream() {
        let mut fl = FixedSizeFreeList::new(1024);
        let s = fl.add_list();
        fl.add_chunk(0x4000, 4096);
        assert_eq!(fl.free_blocks(), 4);
        let a = fl.take(FRESH, 1024).unwrap();
        assert_eq!(a, 0x4000);
        fl.give_back(s, a, 1024).unwrap();
        assert!(fl.can_take(s, 1) && fl.free_bytes() == 4096);
        assert!(fl.block_size_for(1025).unwrap_err().is_out_of_memory());
        fl.merge_all_into_fresh();
        assert!(!fl.can_take(s, 1));
        assert_eq!(fl.free_blocks(), 4);
    }
}
