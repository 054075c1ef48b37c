//! The pool's strategy: a coalescing TLSF-style free list (one instance per stream, one for
//! fresh memory), in O(1) per operation.
//!
//! Free blocks sit in segregated size classes (64 - 8 first-level classes by power of two of the
//! size in 256-byte granules, each split in 32 second-level classes), found with two bitmap
//! lookups. The blocks of one list (free, and allocated through it) that touch in memory and lie
//! in one growth region are linked by address (`prev_phys`/`next_phys`), so a block freed on the
//! stream that allocated it finds its free neighbours with no lookup, as in a single-arena TLSF.
//! Blocks at the edge of a run of linked blocks (no neighbour in this list) are indexed by start
//! (`open_start`) or end (`open_end`), so a block entering the list (fresh memory, another
//! stream's block, a merge) links up with its neighbours in O(1). Allocated blocks are found by
//! address. Blocks never coalesce across two regions (two upstream chunks of the pool), and
//! never with another stream's free blocks. A block allocated and freed through one list costs
//! two hash operations, plus one where it touches the edge of a run.
//!
//! # Fit
//! Good fit, not exact best fit: `take` first looks at up to [`EXACT_CLASS_SCAN`] blocks of the
//! request's own size class for one that fits, then takes the first block of the smallest
//! non-empty class whose every block fits. The block chosen is at most `1 + 1/32` times the best
//! fit's size class bound, except when the best fit is in the request's own class beyond the
//! blocks looked at.
//!
//! # Time Complexity
//! `take`, `insert` and `add_chunk` are O(1) (bitmap scans of 64 bits, a bounded class scan,
//! expected O(1) hash operations), and so is the free block ending at an address. Draining,
//! absorbing fresh neighbours and the largest-block figure are O(free blocks) and only run on
//! rare paths; `remove_range` and the blocks of at least a size read only the classes that can
//! hold such blocks (a trim of whole pages never reads the smaller blocks, which a fragmented
//! pool has by the thousand).

#![deny(unsafe_code)]

use super::size_classes::{
    class_at_least, class_of, class_of_bytes, index, ClassMap, CLASSES, GRANULE_SHIFT,
};
use crate::error::{Error, Result};
use crate::resource::{align_up, ALLOCATION_ALIGNMENT};
use crate::suballocator::core::{AddressMap, Block, Found, FreeList};

/// How many blocks of the request's own size class `take` looks at for a fit.
const EXACT_CLASS_SCAN: usize = 4;

const NIL: u32 = u32::MAX;

/// What an arena slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Free,
    Allocated,
    Unused,
}

#[derive(Clone, Copy, Debug)]
struct Node {
    addr: usize,
    size: usize,
    region: usize,
    prev_phys: u32,
    next_phys: u32,
    prev_free: u32,
    next_free: u32,
    state: State,
}

/// The size classes of one stream: which are non-empty, and the first free block of each.
#[derive(Debug)]
struct Classes {
    map: ClassMap,
    heads: Vec<u32>,
}

impl Classes {
    fn new() -> Self {
        Classes {
            map: ClassMap::default(),
            heads: vec![NIL; CLASSES],
        }
    }
}

/// The node of `region` that `open` (blocks with an open start, or end) holds at `at`, taken out
/// of it; `None` where there is none (another region's node stays).
fn take_open(
    open: &mut AddressMap<usize, u32>,
    nodes: &[Node],
    at: usize,
    region: usize,
) -> Option<u32> {
    let n = open
        .get(&at)
        .copied()
        .filter(|&n| nodes[n as usize].region == region)?;
    open.remove(&at);
    Some(n)
}

/// One coalescing good-fit free list, with the blocks allocated through it.
#[derive(Debug)]
pub(crate) struct CoalescingFreeList {
    nodes: Vec<Node>,
    unused: Vec<u32>,
    classes: Classes,
    /// Allocated blocks by start address.
    allocated: AddressMap<usize, u32>,
    /// Blocks with no `prev_phys`, by start address.
    open_start: AddressMap<usize, u32>,
    /// Blocks with no `next_phys`, by end address.
    open_end: AddressMap<usize, u32>,
    free_bytes: usize,
    free_blocks: usize,
}

impl Default for CoalescingFreeList {
    fn default() -> Self {
        Self::empty()
    }
}

impl CoalescingFreeList {
    /// An empty list.
    pub(crate) fn empty() -> Self {
        CoalescingFreeList {
            nodes: Vec::new(),
            unused: Vec::new(),
            classes: Classes::new(),
            allocated: AddressMap::default(),
            open_start: AddressMap::default(),
            open_end: AddressMap::default(),
            free_bytes: 0,
            free_blocks: 0,
        }
    }

    fn new_node(&mut self, block: Block, state: State) -> u32 {
        let node = Node {
            addr: block.addr,
            size: block.size,
            region: block.region,
            prev_phys: NIL,
            next_phys: NIL,
            prev_free: NIL,
            next_free: NIL,
            state,
        };
        if let Some(i) = self.unused.pop() {
            self.nodes[i as usize] = node;
            i
        } else {
            self.nodes.push(node);
            (self.nodes.len() - 1) as u32
        }
    }

    fn drop_node(&mut self, i: u32) {
        self.nodes[i as usize].state = State::Unused;
        self.unused.push(i);
    }

    fn block(&self, i: u32) -> Block {
        let n = &self.nodes[i as usize];
        Block {
            addr: n.addr,
            size: n.size,
            region: n.region,
        }
    }

    #[inline]
    fn is_free(&self, i: u32) -> bool {
        i != NIL && self.nodes[i as usize].state == State::Free
    }

    /// Puts node `i` into its size class, as free.
    #[inline]
    fn link(&mut self, i: u32) {
        let class = class_of_bytes(self.nodes[i as usize].size);
        let slot = index(class);
        let head = self.classes.heads[slot];
        self.classes.heads[slot] = i;
        self.classes.map.mark(class);
        if head != NIL {
            self.nodes[head as usize].prev_free = i;
        }
        let n = &mut self.nodes[i as usize];
        n.prev_free = NIL;
        n.next_free = head;
        n.state = State::Free;
        self.free_bytes += n.size;
        self.free_blocks += 1;
    }

    /// Takes free node `i` out of its size class (its state is the caller's to set).
    #[inline]
    fn unlink(&mut self, i: u32) {
        let n = self.nodes[i as usize];
        if n.prev_free != NIL {
            self.nodes[n.prev_free as usize].next_free = n.next_free;
        }
        if n.next_free != NIL {
            self.nodes[n.next_free as usize].prev_free = n.prev_free;
        }
        if n.prev_free == NIL {
            let class = class_of_bytes(n.size);
            self.classes.heads[index(class)] = n.next_free;
            if n.next_free == NIL {
                self.classes.map.clear(class);
            }
        }
        self.free_bytes -= n.size;
        self.free_blocks -= 1;
    }

    /// Links new node `x` (not linked yet) with its neighbours in this list, of its region.
    fn attach(&mut self, x: u32) {
        let Block { addr, size, region } = self.block(x);
        let end = addr + size;
        match take_open(&mut self.open_end, &self.nodes, addr, region) {
            Some(p) => self.link_phys(p, x),
            None => {
                self.open_start.insert(addr, x);
            }
        }
        match take_open(&mut self.open_start, &self.nodes, end, region) {
            Some(n) => self.link_phys(x, n),
            None => {
                self.open_end.insert(end, x);
            }
        }
    }

    /// Links `a` and `b` by address (`b` starts where `a` ends).
    fn link_phys(&mut self, a: u32, b: u32) {
        self.nodes[a as usize].next_phys = b;
        self.nodes[b as usize].prev_phys = a;
    }

    /// Unlinks node `x` from its neighbours, which become open there (`x` leaves the list).
    fn detach(&mut self, x: u32) {
        let n = self.nodes[x as usize];
        if n.prev_phys == NIL {
            self.open_start.remove(&n.addr);
        } else {
            self.nodes[n.prev_phys as usize].next_phys = NIL;
            self.open_end.insert(n.addr, n.prev_phys);
        }
        if n.next_phys == NIL {
            self.open_end.remove(&(n.addr + n.size));
        } else {
            self.nodes[n.next_phys as usize].prev_phys = NIL;
            self.open_start.insert(n.addr + n.size, n.next_phys);
        }
    }

    /// Splits node `i` (out of the classes) after `size` bytes; the (head, tail) node ids. The
    /// node that keeps `i` is the one that saves a map update.
    #[inline]
    fn split(&mut self, i: u32, size: usize) -> (u32, u32) {
        let n = self.nodes[i as usize];
        let keep_head = n.next_phys != NIL || n.prev_phys == NIL;
        let (head, tail) = if keep_head {
            let t = self.new_node(
                Block {
                    addr: n.addr + size,
                    size: n.size - size,
                    region: n.region,
                },
                State::Allocated,
            );
            (i, t)
        } else {
            let h = self.new_node(
                Block {
                    addr: n.addr,
                    size,
                    region: n.region,
                },
                State::Allocated,
            );
            (h, i)
        };
        {
            let h = &mut self.nodes[head as usize];
            h.addr = n.addr;
            h.size = size;
            h.prev_phys = n.prev_phys;
            h.next_phys = tail;
        }
        {
            let t = &mut self.nodes[tail as usize];
            t.addr = n.addr + size;
            t.size = n.size - size;
            t.prev_phys = head;
            t.next_phys = n.next_phys;
        }
        if keep_head {
            if n.next_phys == NIL {
                self.open_end.insert(n.addr + n.size, tail);
            } else {
                self.nodes[n.next_phys as usize].prev_phys = tail;
            }
        } else {
            // Here `n.prev_phys == NIL` is false: the head's prev keeps pointing at it.
            self.nodes[n.prev_phys as usize].next_phys = head;
        }
        (head, tail)
    }

    /// The free block `take(size)` would use.
    #[inline]
    fn candidate(&self, size: usize) -> Option<u32> {
        let classes = &self.classes;
        let mut i = classes.heads[index(class_of_bytes(size))];
        let mut looked = 0;
        while i != NIL && looked < EXACT_CLASS_SCAN {
            let n = &self.nodes[i as usize];
            if n.size >= size {
                return Some(i);
            }
            i = n.next_free;
            looked += 1;
        }
        let class = classes
            .map
            .first_at_or_above(class_at_least(size >> GRANULE_SHIFT)?)?;
        Some(classes.heads[index(class)])
    }

    /// Takes a free block of `size` out of the classes, split off; its node (not free).
    #[inline]
    fn carve(&mut self, size: usize) -> Option<u32> {
        let i = self.candidate(size)?;
        self.unlink(i);
        if self.nodes[i as usize].size == size {
            self.nodes[i as usize].state = State::Allocated;
            return Some(i);
        }
        let (head, tail) = self.split(i, size);
        self.nodes[head as usize].state = State::Allocated;
        self.link(tail);
        Some(head)
    }

    /// Every free node id (the non-empty classes only, found through the bitmaps).
    fn all_free(&self) -> Vec<u32> {
        self.free_at_least(0)
    }

    /// The ids of the free nodes of at least `min` bytes: the classes from `min`'s own up
    /// (found through the bitmaps), so smaller blocks are never looked at.
    fn free_at_least(&self, min: usize) -> Vec<u32> {
        let mut out = Vec::new();
        for class in self.classes.map.marked_from(class_of(min >> GRANULE_SHIFT)) {
            let mut i = self.classes.heads[index(class)];
            while i != NIL {
                if self.nodes[i as usize].size >= min {
                    out.push(i);
                }
                i = self.nodes[i as usize].next_free;
            }
        }
        out
    }

    /// The free node of exactly `block`, if there is one (looking in its size class only).
    fn free_node_of(&self, block: Block) -> Option<u32> {
        if let Some(&i) = self.open_start.get(&block.addr) {
            return (self.is_free(i) && self.block(i) == block).then_some(i);
        }
        let mut i = *self.classes.heads.get(index(class_of_bytes(block.size)))?;
        while i != NIL {
            if self.block(i) == block {
                return Some(i);
            }
            i = self.nodes[i as usize].next_free;
        }
        None
    }

    /// Makes node `x` (linked, not free, not in the classes) free, coalescing with its free
    /// neighbours.
    #[inline]
    fn make_free(&mut self, x: u32) {
        let mut at = x;
        let next = self.nodes[x as usize].next_phys;
        if self.is_free(next) {
            self.unlink(next);
            self.absorb_next(x, next);
        }
        let prev = self.nodes[x as usize].prev_phys;
        if self.is_free(prev) {
            self.unlink(prev);
            self.absorb_next(prev, x);
            at = prev;
        }
        self.link(at);
    }

    /// Merges node `b` (the physical successor of `a`, out of the classes) into `a`.
    #[inline]
    fn absorb_next(&mut self, a: u32, b: u32) {
        let nb = self.nodes[b as usize];
        let na = &mut self.nodes[a as usize];
        na.size += nb.size;
        na.next_phys = nb.next_phys;
        if nb.next_phys == NIL {
            self.open_end.insert(nb.addr + nb.size, a);
        } else {
            self.nodes[nb.next_phys as usize].prev_phys = a;
        }
        self.drop_node(b);
    }

    /// Takes free node `i` out of the list entirely; its block.
    fn remove_free_node(&mut self, i: u32) -> Block {
        self.unlink(i);
        self.detach(i);
        let b = self.block(i);
        self.drop_node(i);
        b
    }

    /// Takes the allocated block at `addr` out of the map of allocated blocks when it is the
    /// block a request of `bytes` gets (of `block_size_for(bytes)`); its node.
    #[inline]
    fn unrecord(&mut self, addr: usize, bytes: usize) -> Found<u32> {
        let Some(x) = self.allocated.remove(&addr) else {
            return Found::No;
        };
        let size = self.nodes[x as usize].size;
        // `block_size_for(bytes)`; a request that overflows wraps below 256 and gives 0, which
        // is no block's size (nor is a request of 0).
        let rounded = bytes.wrapping_add(ALLOCATION_ALIGNMENT - 1) & !(ALLOCATION_ALIGNMENT - 1);
        if rounded == size {
            Found::Yes(x)
        } else {
            self.allocated.insert(addr, x);
            Found::OtherSize(size)
        }
    }

    /// The free blocks of this list, of `block`'s region, that end where `block` starts or start
    /// where it ends.
    fn free_neighbours(&self, block: Block) -> impl Iterator<Item = u32> + '_ {
        let free_of_region =
            move |i: u32| self.is_free(i) && self.nodes[i as usize].region == block.region;
        let before = self.open_end.get(&block.addr).copied();
        let after = self.open_start.get(&block.end()).copied();
        before
            .into_iter()
            .chain(after)
            .filter(move |&i| free_of_region(i))
    }

    /// Whether a free block of this list, of `region`, ends at `addr` or starts at `end`.
    fn borders_free(&self, addr: usize, end: usize, region: usize) -> bool {
        let free_of_region = |i: u32| self.is_free(i) && self.nodes[i as usize].region == region;
        self.open_end.get(&addr).is_some_and(|&p| free_of_region(p))
            || self
                .open_start
                .get(&end)
                .is_some_and(|&n| free_of_region(n))
    }
}

impl FreeList for CoalescingFreeList {
    type Sizing = ();

    const COALESCES: bool = true;

    fn new(_sizing: &()) -> Self {
        Self::empty()
    }

    fn block_size_for(_sizing: &(), bytes: usize) -> Result<usize> {
        align_up(bytes, ALLOCATION_ALIGNMENT)
            .ok_or_else(|| Error::out_of_memory(bytes, "request size overflows"))
    }

    fn can_take(&self, size: usize) -> bool {
        self.candidate(size).is_some()
    }

    fn take(&mut self, size: usize) -> Option<Block> {
        let i = self.carve(size)?;
        self.detach(i);
        let b = self.block(i);
        self.drop_node(i);
        Some(b)
    }

    #[inline]
    fn take_allocated(&mut self, size: usize) -> Option<usize> {
        let i = self.carve(size)?;
        let addr = self.nodes[i as usize].addr;
        self.allocated.insert(addr, i);
        Some(addr)
    }

    fn adopt(&mut self, block: Block) {
        let x = self.new_node(block, State::Allocated);
        self.attach(x);
        self.allocated.insert(block.addr, x);
    }

    #[inline]
    fn free_allocated(&mut self, addr: usize, bytes: usize) -> Found<usize> {
        self.unrecord(addr, bytes).map(|x| {
            let size = self.nodes[x as usize].size;
            self.make_free(x);
            size
        })
    }

    fn allocated_size_at(&self, addr: usize) -> Option<usize> {
        self.allocated.get(&addr).map(|&x| self.block(x).size)
    }

    fn allocated_blocks(&self) -> Vec<Block> {
        self.allocated.values().map(|&x| self.block(x)).collect()
    }

    fn forget(&mut self, addr: usize, bytes: usize) -> Found<Block> {
        self.unrecord(addr, bytes).map(|x| {
            self.detach(x);
            let b = self.block(x);
            self.drop_node(x);
            b
        })
    }

    #[inline]
    fn insert(&mut self, block: Block) {
        let x = self.new_node(block, State::Allocated);
        self.attach(x);
        self.make_free(x);
    }

    fn drain(&mut self) -> Vec<Block> {
        self.all_free()
            .into_iter()
            .map(|i| self.remove_free_node(i))
            .collect()
    }

    /// Looks at the free blocks of whichever list has fewer.
    fn absorb_bordering(&mut self, fresh: &mut Self) -> bool {
        if self.free_blocks == 0 || fresh.free_blocks == 0 {
            return false;
        }
        let bordering: Vec<u32> = if self.free_blocks <= fresh.free_blocks {
            let mut ids: Vec<u32> = self
                .all_free()
                .into_iter()
                .flat_map(|i| fresh.free_neighbours(self.block(i)))
                .collect();
            // By address; a fresh block between two of this list's free blocks is found twice.
            ids.sort_unstable_by_key(|&i| fresh.nodes[i as usize].addr);
            ids.dedup();
            ids
        } else {
            fresh
                .all_free()
                .into_iter()
                .filter(|&i| {
                    let n = fresh.block(i);
                    self.borders_free(n.addr, n.end(), n.region)
                })
                .collect()
        };
        for &i in &bordering {
            let block = fresh.remove_free_node(i);
            self.insert(block);
        }
        !bordering.is_empty()
    }

    fn remove_block(&mut self, block: Block) -> bool {
        match self.free_node_of(block) {
            Some(i) => {
                self.remove_free_node(i);
                true
            }
            None => false,
        }
    }

    fn remove_range(&mut self, addr: usize, size: usize) -> bool {
        let Some(end) = addr.checked_add(size) else {
            return false;
        };
        // The block that holds the range is at least `size` bytes: the smaller are not read.
        let found = self.free_at_least(size).into_iter().find(|&i| {
            let n = &self.nodes[i as usize];
            n.addr <= addr && end <= n.addr + n.size
        });
        let Some(i) = found else {
            return false;
        };
        let b = self.remove_free_node(i);
        if b.addr < addr {
            self.insert(Block {
                addr: b.addr,
                size: addr - b.addr,
                region: b.region,
            });
        }
        if end < b.end() {
            self.insert(Block {
                addr: end,
                size: b.end() - end,
                region: b.region,
            });
        }
        true
    }

    fn free_ranges(&self) -> Vec<Block> {
        self.free_ranges_at_least(0)
    }

    fn free_ranges_at_least(&self, min: usize) -> Vec<Block> {
        let mut out: Vec<Block> = self
            .free_at_least(min)
            .into_iter()
            .map(|i| self.block(i))
            .collect();
        out.sort_unstable_by_key(|b| b.addr);
        out
    }

    /// A free block ending at `end` either has nothing of this list after it (indexed as open
    /// there) or is followed by an allocated block of this list starting at `end` (a free
    /// neighbour would have coalesced with it).
    fn free_block_ending_at(&self, end: usize) -> Option<Block> {
        let before_allocated = || {
            let next = *self.allocated.get(&end)?;
            Some(self.nodes[next as usize].prev_phys)
        };
        let i = self.open_end.get(&end).copied().or_else(before_allocated)?;
        (self.is_free(i) && self.block(i).end() == end).then(|| self.block(i))
    }

    fn free_bytes(&self) -> usize {
        self.free_bytes
    }

    fn free_blocks(&self) -> usize {
        self.free_blocks
    }

    fn largest_free_block(&self) -> usize {
        let mut largest = 0;
        if let Some(class) = self.classes.map.highest() {
            let mut i = self.classes.heads[index(class)];
            while i != NIL {
                largest = largest.max(self.nodes[i as usize].size);
                i = self.nodes[i as usize].next_free;
            }
        }
        largest
    }
}

#[cfg(test)]
impl CoalescingFreeList {
    /// Panics unless every internal invariant holds: physical links are mutual, contiguous and
    /// within one region, and every block with no link on a side is indexed as open there and
    /// has no neighbour of its region in the list on that side; every free block is in the
    /// class list its size says; the bitmaps and counters match; allocated blocks are exactly
    /// the map's; no two free blocks touch (fully coalesced).
    pub(crate) fn check_invariants(&self) {
        use std::collections::HashMap;
        let in_classes = self.classes.map.check_lists(&self.classes.heads, |i| {
            let n = &self.nodes[i as usize];
            (n.state == State::Free, n.size, n.prev_free, n.next_free)
        });
        assert_eq!(in_classes, (self.free_bytes, self.free_blocks));
        let by_start: HashMap<(usize, usize), u32> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.state != State::Unused)
            .map(|(i, n)| ((n.addr, n.region), i as u32))
            .collect();
        let mut used = 0;
        let mut allocated = 0;
        for (i, n) in self.nodes.iter().enumerate() {
            let i = i as u32;
            if n.state == State::Unused {
                continue;
            }
            used += 1;
            assert!(n.size > 0 && n.size % 256 == 0 && n.addr % 256 == 0);
            let end = n.addr + n.size;
            if n.next_phys == NIL {
                assert_eq!(self.open_end.get(&end), Some(&i), "open end indexed");
                assert!(
                    !by_start.contains_key(&(end, n.region)),
                    "unlinked neighbour"
                );
            } else {
                let m = &self.nodes[n.next_phys as usize];
                assert_eq!((m.prev_phys, m.addr, m.region), (i, end, n.region));
                assert!(
                    !(n.state == State::Free && m.state == State::Free),
                    "not coalesced"
                );
            }
            if n.prev_phys == NIL {
                assert_eq!(self.open_start.get(&n.addr), Some(&i), "open start indexed");
            } else {
                assert_eq!(self.nodes[n.prev_phys as usize].next_phys, i);
            }
            if n.state == State::Allocated {
                allocated += 1;
                assert_eq!(self.allocated.get(&n.addr), Some(&i));
            }
        }
        assert_eq!(allocated, self.allocated.len());
        let open_start = self
            .nodes
            .iter()
            .filter(|n| n.state != State::Unused && n.prev_phys == NIL)
            .count();
        let open_end = self
            .nodes
            .iter()
            .filter(|n| n.state != State::Unused && n.next_phys == NIL)
            .count();
        assert_eq!(
            (open_start, open_end),
            (self.open_start.len(), self.open_end.len())
        );
        assert_eq!(used + self.unused.len(), self.nodes.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        Take { list: usize, granules: usize },
        Give { pick: usize, list: usize },
        Chunk { granules: usize },
        MergeAll,
        RemoveFreeChunks,
        AbsorbFresh { list: usize },
        Trim { pick: usize, granules: usize },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0..4usize, 1..200usize).prop_map(|(list, granules)| Op::Take { list, granules }),
            5 => (any::<usize>(), 0..4usize).prop_map(|(pick, list)| Op::Give { pick, list }),
            1 => (1..2000usize).prop_map(|granules| Op::Chunk { granules }),
            1 => Just(Op::MergeAll),
            1 => Just(Op::RemoveFreeChunks),
            1 => (1..4usize).prop_map(|list| Op::AbsorbFresh { list }),
            1 => (any::<usize>(), 1..4usize).prop_map(|(pick, granules)| Op::Trim { pick, granules }),
        ]
    }

    /// The lookups a growth and a trim use (blocks of at least a size, the block ending at an
    /// address) agree with a model read of every node, for sizes and ends around every block
    /// and chunk.
    fn check_lookups(
        l: &CoalescingFreeList,
        chunks: &[Block],
    ) -> std::result::Result<(), TestCaseError> {
        let mut all: Vec<Block> = (0..l.nodes.len() as u32)
            .filter(|&i| l.nodes[i as usize].state == State::Free)
            .map(|i| l.block(i))
            .collect();
        all.sort_unstable_by_key(|b| b.addr);
        prop_assert_eq!(&l.free_ranges(), &all);
        let allocated = l.allocated_blocks();
        let edges: Vec<Block> = all
            .iter()
            .chain(&allocated)
            .chain(chunks)
            .copied()
            .collect();
        for b in &edges {
            for min in [b.size.saturating_sub(256), b.size, b.size + 1, b.size + 256] {
                let model: Vec<Block> = all.iter().filter(|f| f.size >= min).copied().collect();
                prop_assert_eq!(l.free_ranges_at_least(min), model, "at least {}", min);
            }
            for end in [b.addr, b.end(), b.end() + 256] {
                let model = all.iter().find(|f| f.end() == end).copied();
                prop_assert_eq!(l.free_block_ending_at(end), model, "ending at {:#x}", end);
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

        /// Random operations on four lists (0 = fresh) keep every internal invariant, and what
        /// `take` hands out never overlaps and never crosses a chunk.
        #[test]
        fn random_operations_keep_the_invariants(ops in proptest::collection::vec(op(), 1..200)) {
            let mut lists: Vec<CoalescingFreeList> = (0..4).map(|_| CoalescingFreeList::new(&())).collect();
            let mut next_addr = 0x100_0000usize;
            let mut chunks: Vec<Block> = Vec::new();
            let mut live: Vec<(Block, Option<usize>)> = Vec::new();
            let mut trimmed = 0;
            for op in ops {
                match op {
                    Op::Take { list, granules } => {
                        let size = granules * 256;
                        let could = lists[list].can_take(size);
                        // Odd sizes through `take_allocated` (recorded in the list), even ones
                        // taken out entirely.
                        let got = if granules % 2 == 1 {
                            lists[list].take_allocated(size).map(|addr| {
                                let region = chunks.iter().find(|c| c.addr <= addr && addr < c.end()).map_or(0, |c| c.region);
                                (Block { addr, size, region }, Some(list))
                            })
                        } else {
                            lists[list].take(size).map(|b| (b, None))
                        };
                        prop_assert_eq!(could, got.is_some());
                        if let Some((b, owner)) = got {
                            prop_assert_eq!(b.size, size);
                            prop_assert!(chunks.iter().any(|c| c.region == b.region && c.addr <= b.addr && b.end() <= c.end()));
                            prop_assert!(live.iter().all(|(q, _)| b.end() <= q.addr || q.end() <= b.addr));
                            live.push((b, owner));
                        }
                    }
                    Op::Give { pick, list } => {
                        if !live.is_empty() {
                            let (b, owner) = live.swap_remove(pick % live.len());
                            if let Some(o) = owner {
                                // A wrong size is refused and changes nothing.
                                prop_assert_eq!(lists[o].free_allocated(b.addr, b.size + 256), Found::OtherSize(b.size));
                                prop_assert_eq!(lists[o].forget(b.addr, b.size - 256), Found::OtherSize(b.size));
                            }
                            match owner {
                                Some(o) if o == list => prop_assert_eq!(lists[list].free_allocated(b.addr, b.size), Found::Yes(b.size)),
                                Some(o) => {
                                    prop_assert_eq!(lists[list].free_allocated(b.addr, b.size), Found::No);
                                    prop_assert_eq!(lists[o].forget(b.addr, b.size), Found::Yes(b));
                                    prop_assert_eq!(lists[o].forget(b.addr, b.size), Found::No, "forgotten once");
                                    lists[list].insert(b);
                                }
                                None => {
                                    prop_assert_eq!(lists[list].free_allocated(b.addr, b.size), Found::No, "not recorded");
                                    lists[list].insert(b);
                                }
                            }
                            prop_assert_eq!(lists[list].free_allocated(b.addr, b.size), Found::No, "double free refused");
                        }
                    }
                    Op::Chunk { granules } => {
                        // Chunks sometimes adjacent, to check they stay apart.
                        let size = granules * 256;
                        let c = Block { addr: next_addr, size, region: next_addr };
                        lists[0].add_chunk(c);
                        chunks.push(c);
                        next_addr += size + if granules % 2 == 0 { 0 } else { 4096 };
                    }
                    Op::MergeAll => {
                        for l in 1..4 {
                            for b in lists[l].drain() {
                                lists[0].insert(b);
                            }
                        }
                    }
                    Op::AbsorbFresh { list } => {
                        let before: usize = lists.iter().map(|l| l.free_bytes()).sum();
                        let (fresh, rest) = lists.split_at_mut(1);
                        rest[list - 1].absorb_bordering(&mut fresh[0]);
                        let after: usize = lists.iter().map(|l| l.free_bytes()).sum();
                        prop_assert_eq!(after, before);
                    }
                    Op::RemoveFreeChunks => {
                        for at in (0..chunks.len()).rev() {
                            if lists[0].remove_block(chunks[at]) {
                                chunks.swap_remove(at);
                            }
                        }
                    }
                    Op::Trim { pick, granules } => {
                        let ranges = lists[0].free_ranges();
                        if !ranges.is_empty() {
                            let b = ranges[pick % ranges.len()];
                            let size = (granules * 256).min(b.size);
                            prop_assert!(lists[0].remove_range(b.addr + b.size - size, size));
                            trimmed += size;
                        }
                    }
                }
                for l in &lists {
                    l.check_invariants();
                    check_lookups(l, &chunks)?;
                }
            }
            let held: usize = chunks.iter().map(|c| c.size).sum();
            let used: usize = live.iter().map(|(b, _)| b.size).sum();
            let free: usize = lists.iter().map(|l| l.free_bytes()).sum();
            prop_assert_eq!(free + used + trimmed, held);
            if trimmed == 0 {
                for (b, owner) in live {
                    match owner {
                        Some(o) => prop_assert_eq!(lists[o].free_allocated(b.addr, b.size), Found::Yes(b.size)),
                        None => lists[1].insert(b),
                    }
                }
                for l in 1..4 {
                    for b in lists[l].drain() {
                        lists[0].insert(b);
                    }
                }
                prop_assert_eq!(lists[0].free_blocks(), chunks.len());
                for c in &chunks {
                    prop_assert!(lists[0].remove_block(*c), "every chunk whole again");
                }
                lists[0].check_invariants();
            }
        }
    }

    #[test]
    fn split_coalesce_and_region_boundaries() {
        let mut fl = CoalescingFreeList::new(&());
        fl.add_chunk(Block {
            addr: 0x10000,
            size: 4096,
            region: 1,
        });
        // Adjacent but another region (another upstream chunk).
        fl.add_chunk(Block {
            addr: 0x11000,
            size: 4096,
            region: 2,
        });
        let a = fl.take(1024).unwrap();
        let b = fl.take(1024).unwrap();
        assert_eq!((a.region, b.addr), (a.region, a.addr + 1024));
        assert_eq!(fl.free_bytes(), 8192 - 2048);
        fl.insert(a);
        fl.insert(b);
        assert_eq!(fl.free_blocks(), 2, "never coalesce across regions");
        assert_eq!(fl.largest_free_block(), 4096);
        // One region grown at its end: the extension coalesces.
        fl.add_chunk(Block {
            addr: 0x12000,
            size: 4096,
            region: 2,
        });
        assert_eq!(fl.free_blocks(), 2);
        assert_eq!(fl.largest_free_block(), 8192);
        assert!(fl.remove_range(0x12000, 4096));
        assert!(!fl.remove_range(0x12000, 256), "already gone");
        assert!(fl.remove_block(Block {
            addr: 0x10000,
            size: 4096,
            region: 1
        }));
        assert!(fl.remove_block(Block {
            addr: 0x11000,
            size: 4096,
            region: 2
        }));
        assert_eq!(fl.free_bytes(), 0);
        fl.check_invariants();
    }

    #[test]
    fn absorb_moves_only_bordering_fresh_blocks() {
        let mut fresh = CoalescingFreeList::new(&());
        let mut mine = CoalescingFreeList::new(&());
        fresh.add_chunk(Block {
            addr: 0x10000,
            size: 3 * 256,
            region: 7,
        });
        fresh.add_chunk(Block {
            addr: 0x20000,
            size: 1024,
            region: 8,
        });
        let a = fresh.take(256).unwrap();
        assert_eq!(a.addr, 0x10000);
        mine.insert(a);
        assert!(!mine.can_take(768));
        assert!(mine.absorb_bordering(&mut fresh));
        assert_eq!(mine.take(768).map(|b| b.addr), Some(0x10000));
        assert_eq!((fresh.free_blocks(), fresh.free_bytes()), (1, 1024));
        mine.check_invariants();
        fresh.check_invariants();
    }
}
