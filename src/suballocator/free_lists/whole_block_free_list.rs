//! The whole-block strategy of a reuse cache: every block is one upstream allocation, handed
//! out whole to a request of its size class and never split nor coalesced, so each goes back to
//! the upstream on its own. Free blocks are kept per block size (a size-class floor, see
//! `size_classes.rs`: at most 1/32 above the request).
//!
//! # Time Complexity
//! `take`, `insert`, `remove_block`, a free: O(1) expected (hash maps and swap-removal);
//! `largest_free_block`: O(distinct free sizes); draining: O(free blocks).

#![deny(unsafe_code)]

use super::size_classes::round_up_to_class;
use crate::error::{Error, Result};
use crate::suballocator::core::{AddressMap, Block, Found, FreeList};

/// Free blocks by size (each size's a stack, newest on top), where each free block sits in its
/// stack, and the blocks allocated through the list.
#[derive(Debug, Default)]
pub(crate) struct WholeBlockFreeList {
    by_size: AddressMap<usize, Vec<usize>>,
    /// Free block address -> (size, index in its size's stack).
    position: AddressMap<usize, (usize, usize)>,
    free_bytes: usize,
    allocated: AddressMap<usize, usize>,
}

impl WholeBlockFreeList {
    /// The allocated block at `addr`, if a request of `bytes` gets a block of its size.
    fn check(&self, addr: usize, bytes: usize) -> Found<usize> {
        match self.allocated.get(&addr) {
            None => Found::No,
            Some(&size) if round_up_to_class(bytes) == Some(size) => Found::Yes(size),
            Some(&size) => Found::OtherSize(size),
        }
    }

    fn push_free(&mut self, block: Block) {
        let stack = self.by_size.entry(block.size).or_default();
        self.position.insert(block.addr, (block.size, stack.len()));
        stack.push(block.addr);
        self.free_bytes += block.size;
    }
}

impl FreeList for WholeBlockFreeList {
    type Sizing = ();

    fn new((): &()) -> Self {
        Self::default()
    }

    fn block_size_for((): &(), bytes: usize) -> Result<usize> {
        round_up_to_class(bytes).ok_or_else(|| {
            Error::out_of_memory(bytes, "the request is larger than any allocation can be")
        })
    }

    fn can_take(&self, size: usize) -> bool {
        self.by_size.get(&size).is_some_and(|s| !s.is_empty())
    }

    fn take(&mut self, size: usize) -> Option<Block> {
        let addr = self.by_size.get_mut(&size)?.pop()?;
        self.position.remove(&addr);
        self.free_bytes -= size;
        Some(Block {
            addr,
            size,
            region: addr,
        })
    }

    fn adopt(&mut self, block: Block) {
        self.allocated.insert(block.addr, block.size);
    }

    fn free_allocated(&mut self, addr: usize, bytes: usize) -> Found<usize> {
        let found = self.check(addr, bytes);
        if let Found::Yes(size) = found {
            self.allocated.remove(&addr);
            self.push_free(Block {
                addr,
                size,
                region: addr,
            });
        }
        found
    }

    fn allocated_size_at(&self, addr: usize) -> Option<usize> {
        self.allocated.get(&addr).copied()
    }

    fn allocated_blocks(&self) -> Vec<Block> {
        self.allocated
            .iter()
            .map(|(&addr, &size)| Block {
                addr,
                size,
                region: addr,
            })
            .collect()
    }

    fn forget(&mut self, addr: usize, bytes: usize) -> Found<Block> {
        let found = self.check(addr, bytes);
        if let Found::Yes(_) = found {
            self.allocated.remove(&addr);
        }
        found.map(|size| Block {
            addr,
            size,
            region: addr,
        })
    }

    fn insert(&mut self, block: Block) {
        self.push_free(block);
    }

    fn drain(&mut self) -> Vec<Block> {
        self.position.clear();
        self.free_bytes = 0;
        self.by_size
            .drain()
            .flat_map(|(size, stack)| {
                stack.into_iter().map(move |addr| Block {
                    addr,
                    size,
                    region: addr,
                })
            })
            .collect()
    }

    fn remove_block(&mut self, block: Block) -> bool {
        match self.position.get(&block.addr) {
            Some(&(size, index)) if size == block.size => {
                self.position.remove(&block.addr);
                let stack = self.by_size.get_mut(&size).expect("a free block's stack");
                stack.swap_remove(index);
                if let Some(&moved) = stack.get(index) {
                    self.position.insert(moved, (size, index));
                }
                self.free_bytes -= size;
                true
            }
            _ => false,
        }
    }

    fn free_ranges(&self) -> Vec<Block> {
        self.position
            .iter()
            .map(|(&addr, &(size, _))| Block {
                addr,
                size,
                region: addr,
            })
            .collect()
    }

    fn free_bytes(&self) -> usize {
        self.free_bytes
    }

    fn free_blocks(&self) -> usize {
        self.position.len()
    }

    fn largest_free_block(&self) -> usize {
        self.by_size
            .iter()
            .filter(|(_, stack)| !stack.is_empty())
            .map(|(&size, _)| size)
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn block(addr: usize, size: usize) -> Block {
        Block {
            addr,
            size,
            region: addr,
        }
    }

    #[test]
    fn blocks_are_reused_whole_by_requests_of_their_class() {
        let mut list = WholeBlockFreeList::new(&());
        let size = WholeBlockFreeList::block_size_for(&(), 10_000).unwrap();
        assert_eq!(size, 10_240, "40 granules: a class floor");
        list.add_chunk(block(0x10_0000, size));
        let b = list.take(size).unwrap();
        list.adopt(b);
        assert_eq!(list.free_allocated(b.addr, 1), Found::OtherSize(size));
        assert_eq!(list.free_allocated(0x20_0000, 10_000), Found::No);
        assert_eq!(list.free_allocated(b.addr, 10_100), Found::Yes(size));
        assert_eq!(
            list.free_allocated(b.addr, 10_000),
            Found::No,
            "double free"
        );
        assert_eq!((list.free_bytes(), list.free_blocks()), (size, 1));
        assert!(list.can_take(size) && !list.can_take(size + 256));
        assert!(list.remove_block(b));
        assert!(!list.remove_block(b));
        assert_eq!((list.free_bytes(), list.largest_free_block()), (0, 0));
    }

    proptest! {
        /// Against a model (a map of free blocks): inserts, takes and removals in any order
        /// keep the figures and the blocks exactly.
        #[test]
        fn matches_a_model(ops in proptest::collection::vec((0u8..3, 0usize..64, 1usize..4), 1..300)) {
            let mut list = WholeBlockFreeList::new(&());
            let mut model: BTreeMap<usize, usize> = BTreeMap::new();
            for (op, slot, size_class) in ops {
                let addr = 0x1000_0000 + slot * 0x10_0000;
                let size = size_class * 4096;
                match op {
                    0 if !model.contains_key(&addr) => {
                        list.insert(block(addr, size));
                        model.insert(addr, size);
                    }
                    1 => {
                        let got = list.take(size);
                        match got {
                            Some(b) => prop_assert_eq!(model.remove(&b.addr), Some(size)),
                            None => prop_assert!(!model.values().any(|&s| s == size)),
                        }
                    }
                    2 => {
                        let expected = model.get(&addr).copied();
                        let removed = list.remove_block(block(addr, size));
                        prop_assert_eq!(removed, expected == Some(size));
                        if removed {
                            model.remove(&addr);
                        }
                    }
                    _ => {}
                }
                prop_assert_eq!(list.free_bytes(), model.values().sum::<usize>());
                prop_assert_eq!(list.free_blocks(), model.len());
                prop_assert_eq!(list.largest_free_block(), model.values().copied().max().unwrap_or(0));
            }
            let mut drained: Vec<(usize, usize)> = list.drain().iter().map(|b| (b.addr, b.size)).collect();
            drained.sort_unstable();
            prop_assert_eq!(drained, model.into_iter().collect::<Vec<_>>());
        }
    }
}
