//! Address-ordered free lists with exact best fit, one per stream, over one address space with
//! no chunk boundaries: two free blocks of one list that touch always coalesce, whatever growth
//! step they came from. The expandable pool's bookkeeping (pure: addresses and sizes only).
//!
//! # Time Complexity
//! `take`, `give_back`, `add_range` and `carve` are O(log n) in the free blocks (balanced trees)
//! plus an expected O(1) hash lookup; merging all lists and the block listing are O(n log n).

#![deny(unsafe_code)]

use super::coalescing_free_list::AddressMap;
use super::stream_ordered::{ListId, FRESH};
use crate::error::{Error, Result};
use std::collections::{BTreeMap, BTreeSet};

/// A free block: its size and the list that holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Free {
    size: usize,
    list: ListId,
}

/// Free blocks by address (all lists) and by size (per list); allocated blocks by address.
#[derive(Debug)]
pub(crate) struct AddressFreeLists {
    free: BTreeMap<usize, Free>,
    by_size: Vec<BTreeSet<(usize, usize)>>,
    allocated: AddressMap<usize, usize>,
    free_bytes: usize,
}

impl Default for AddressFreeLists {
    fn default() -> Self {
        Self::new()
    }
}

impl AddressFreeLists {
    /// Empty lists, with the fresh list (id [`FRESH`]) only.
    pub(crate) fn new() -> Self {
        AddressFreeLists {
            free: BTreeMap::new(),
            by_size: vec![BTreeSet::new()],
            allocated: AddressMap::default(),
            free_bytes: 0,
        }
    }

    /// Adds an empty list and returns its id.
    pub(crate) fn add_list(&mut self) -> ListId {
        self.by_size.push(BTreeSet::new());
        (self.by_size.len() - 1) as ListId
    }

    fn insert(&mut self, addr: usize, size: usize, list: ListId) {
        self.free.insert(addr, Free { size, list });
        self.by_size[list as usize].insert((size, addr));
        self.free_bytes += size;
    }

    fn remove(&mut self, addr: usize) -> Option<Free> {
        let f = self.free.remove(&addr)?;
        self.by_size[f.list as usize].remove(&(f.size, addr));
        self.free_bytes -= f.size;
        Some(f)
    }

    /// Inserts a free block into `list`, coalesced with the free blocks of `list` that touch it.
    fn insert_coalesced(&mut self, mut addr: usize, mut size: usize, list: ListId) {
        if let Some((&prev, &f)) = self.free.range(..addr).next_back() {
            if f.list == list && prev + f.size == addr {
                self.remove(prev);
                addr = prev;
                size += f.size;
            }
        }
        if let Some(&f) = self.free.get(&(addr + size)) {
            if f.list == list {
                self.remove(addr + size);
                size += f.size;
            }
        }
        self.insert(addr, size, list);
    }

    /// Whether `take(list, size)` would succeed.
    pub(crate) fn can_take(&self, list: ListId, size: usize) -> bool {
        self.by_size
            .get(list as usize)
            .is_some_and(|s| s.range((size, 0)..).next().is_some())
    }

    /// Takes the smallest block of `list` that holds `size` bytes (lowest address among equals),
    /// splitting off the rest, which stays in `list`.
    pub(crate) fn take(&mut self, list: ListId, size: usize) -> Option<usize> {
        let &(block, addr) = self.by_size.get(list as usize)?.range((size, 0)..).next()?;
        self.remove(addr);
        if block > size {
            self.insert(addr + size, block - size, list);
        }
        self.allocated.insert(addr, size);
        Some(addr)
    }

    /// Frees an allocated block into `list`, coalesced with its free neighbours in `list`.
    ///
    /// # Errors
    /// [`Error::Logic`] for an address that is not an allocated block.
    pub(crate) fn give_back(&mut self, list: ListId, addr: usize) -> Result<()> {
        let Some(size) = self.allocated.remove(&addr) else {
            return Err(Error::Logic(format!(
                "deallocate of {addr:#x}, which this resource did not allocate (or was freed)"
            )));
        };
        self.insert_coalesced(addr, size, list);
        Ok(())
    }

    /// Adds a new free range to the fresh list, coalesced with fresh neighbours.
    pub(crate) fn add_range(&mut self, addr: usize, size: usize) {
        self.insert_coalesced(addr, size, FRESH);
    }

    /// The size of the fresh block ending exactly at `end`, if there is one.
    pub(crate) fn fresh_ending_at(&self, end: usize) -> Option<usize> {
        let (&addr, f) = self.free.range(..end).next_back()?;
        (f.list == FRESH && addr + f.size == end).then_some(f.size)
    }

    /// Moves the fresh blocks that touch a free block of `list` into `list`, coalesced; whether
    /// any moved.
    pub(crate) fn absorb_fresh_neighbours(&mut self, list: ListId) -> bool {
        if list == FRESH {
            return false;
        }
        let touching: Vec<(usize, usize)> = self
            .by_size
            .get(FRESH as usize)
            .map(|s| {
                s.iter()
                    .map(|&(size, addr)| (addr, size))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
            .into_iter()
            .filter(|&(addr, size)| {
                let before = self
                    .free
                    .range(..addr)
                    .next_back()
                    .is_some_and(|(&a, f)| f.list == list && a + f.size == addr);
                let after = self
                    .free
                    .get(&(addr + size))
                    .is_some_and(|f| f.list == list);
                before || after
            })
            .collect();
        for &(addr, size) in &touching {
            self.remove(addr);
            self.insert_coalesced(addr, size, list);
        }
        !touching.is_empty()
    }

    /// Moves every free block into the fresh list, coalescing touching blocks.
    pub(crate) fn merge_all_into_fresh(&mut self) {
        let blocks: Vec<(usize, usize)> = self.free.iter().map(|(&a, f)| (a, f.size)).collect();
        self.free.clear();
        for s in &mut self.by_size {
            s.clear();
        }
        self.free_bytes = 0;
        let mut run: Option<(usize, usize)> = None;
        for (addr, size) in blocks {
            run = match run {
                Some((a, s)) if a + s == addr => Some((a, s + size)),
                Some((a, s)) => {
                    self.insert(a, s, FRESH);
                    Some((addr, size))
                }
                None => Some((addr, size)),
            };
        }
        if let Some((a, s)) = run {
            self.insert(a, s, FRESH);
        }
    }

    /// Removes `addr .. addr + size`, which lies inside one free block, from the lists; the
    /// parts of the block on either side stay free in its list.
    ///
    /// # Errors
    /// [`Error::Logic`] when the range is not inside one free block.
    pub(crate) fn carve(&mut self, addr: usize, size: usize) -> Result<()> {
        let found = self.free.range(..=addr).next_back().map(|(&a, &f)| (a, f));
        let Some((start, f)) = found.filter(|&(a, f)| a + f.size >= addr + size) else {
            return Err(Error::Logic(format!(
                "carve of {addr:#x}+{size:#x}, which is not inside one free block"
            )));
        };
        self.remove(start);
        if addr > start {
            self.insert(start, addr - start, f.list);
        }
        let end = start + f.size;
        if end > addr + size {
            self.insert(addr + size, end - (addr + size), f.list);
        }
        Ok(())
    }

    /// Free blocks in address order: (address, size).
    pub(crate) fn free_blocks_by_address(&self) -> Vec<(usize, usize)> {
        self.free.iter().map(|(&a, f)| (a, f.size)).collect()
    }

    /// Allocated blocks (address, size), in no order.
    pub(crate) fn allocated_blocks(&self) -> Vec<(usize, usize)> {
        self.allocated.iter().map(|(&a, &s)| (a, s)).collect()
    }

    /// Free bytes in all lists.
    pub(crate) fn free_bytes(&self) -> usize {
        self.free_bytes
    }

    /// Free blocks in all lists.
    pub(crate) fn free_count(&self) -> usize {
        self.free.len()
    }

    /// The largest free block.
    pub(crate) fn largest_free_block(&self) -> usize {
        self.by_size
            .iter()
            .filter_map(|s| s.iter().next_back().map(|&(size, _)| size))
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_added_apart_coalesce_when_they_touch() {
        let mut l = AddressFreeLists::new();
        l.add_range(0x1000, 0x1000);
        l.add_range(0x2000, 0x1000);
        assert_eq!(l.free_blocks_by_address(), vec![(0x1000, 0x2000)]);
        assert_eq!(l.fresh_ending_at(0x3000), Some(0x2000));
        let a = l.take(FRESH, 0x1800).unwrap();
        assert_eq!(a, 0x1000);
        assert!(!l.can_take(FRESH, 0x1000));
        let s = l.add_list();
        l.give_back(s, a).unwrap();
        assert_eq!(
            l.free_count(),
            2,
            "a stream's block stays apart from fresh memory"
        );
        assert!(l.absorb_fresh_neighbours(s));
        assert_eq!(l.free_blocks_by_address(), vec![(0x1000, 0x2000)]);
        assert!(l.take(s, 0x2000).is_some());
        assert!(l.give_back(s, 0x1234).is_err());
    }

    #[test]
    fn carve_and_merge() {
        let mut l = AddressFreeLists::new();
        l.add_range(0, 0x4000);
        l.carve(0x1000, 0x2000).unwrap();
        assert_eq!(
            l.free_blocks_by_address(),
            vec![(0, 0x1000), (0x3000, 0x1000)]
        );
        assert!(l.carve(0x800, 0x1000).is_err());
        l.add_range(0x1000, 0x2000);
        assert_eq!(l.free_blocks_by_address(), vec![(0, 0x4000)]);
        let s = l.add_list();
        let a = l.take(FRESH, 0x100).unwrap();
        l.give_back(s, a).unwrap();
        l.merge_all_into_fresh();
        assert_eq!(l.free_blocks_by_address(), vec![(0, 0x4000)]);
        assert_eq!((l.free_bytes(), l.largest_free_block()), (0x4000, 0x4000));
    }
}
