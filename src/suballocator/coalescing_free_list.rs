//! The pool's strategy: a coalescing TLSF-style free list (one instance per stream, one for
//! fresh memory), in O(1) per operation.
//!
//! Free blocks sit in segregated size classes (64 - 8 first-level classes by power of two of the
//! size in 256-byte granules, each split in 32 second-level classes), found with two bitmap
//! lookups. Each list also indexes its free blocks by start and by end address, so a block put
//! back finds its free neighbours (in this list, of the same growth region) in O(1) and
//! coalesces with them: blocks never coalesce across two regions (two upstream chunks of the
//! pool), and never with another stream's free blocks. Allocated blocks are not tracked here
//! (the core keeps them).
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
//! expected O(1) hash operations). Draining, absorbing fresh neighbours, `remove_range` and the
//! largest-block figure are O(free blocks) and only run on rare paths.

#![deny(unsafe_code)]

use super::free_list::{AddressMap, Block, FreeList};
use crate::error::{Error, Result};
use crate::resource::{align_up, ALLOCATION_ALIGNMENT};

const GRANULE_SHIFT: u32 = 8;
const SL_BITS: u32 = 5;
const SL_COUNT: usize = 1 << SL_BITS;
/// First-level classes: sizes up to 2^64 in 256-byte granules.
const FL_COUNT: usize = (usize::BITS - GRANULE_SHIFT - SL_BITS + 1) as usize;
/// How many blocks of the request's own size class `take` looks at for a fit.
pub(crate) const EXACT_CLASS_SCAN: usize = 4;

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Node {
    addr: usize,
    size: usize,
    region: usize,
    prev_free: u32,
    next_free: u32,
    /// Whether the slot holds a free block (else it is on the unused stack).
    used: bool,
}

/// The size classes of one stream.
#[derive(Debug)]
struct Classes {
    fl_bitmap: u64,
    sl_bitmaps: [u32; FL_COUNT],
    heads: Vec<u32>,
}

impl Classes {
    fn new() -> Self {
        Classes {
            fl_bitmap: 0,
            sl_bitmaps: [0; FL_COUNT],
            heads: vec![NIL; FL_COUNT * SL_COUNT],
        }
    }

    /// The first class at or above (fl, sl) with a block.
    #[inline]
    fn find_from(&self, fl: usize, sl: usize) -> Option<(usize, usize)> {
        let sl_map = self.sl_bitmaps[fl] & (!0u32 << sl);
        if sl_map != 0 {
            return Some((fl, sl_map.trailing_zeros() as usize));
        }
        let fl_map = self.fl_bitmap & (!0u64).checked_shl(fl as u32 + 1).unwrap_or(0);
        if fl_map == 0 {
            return None;
        }
        let f = fl_map.trailing_zeros() as usize;
        Some((f, self.sl_bitmaps[f].trailing_zeros() as usize))
    }

    /// The highest non-empty class.
    fn highest(&self) -> Option<(usize, usize)> {
        if self.fl_bitmap == 0 {
            return None;
        }
        let f = 63 - self.fl_bitmap.leading_zeros() as usize;
        Some((f, 31 - self.sl_bitmaps[f].leading_zeros() as usize))
    }
}

/// The size class holding blocks of `size` bytes (a multiple of 256, at least 256).
#[inline]
fn class_of(size: usize) -> (usize, usize) {
    class_of_granules(size >> GRANULE_SHIFT)
}

/// The size class of blocks of `u` granules of 256 bytes.
#[inline]
fn class_of_granules(u: usize) -> (usize, usize) {
    if u < SL_COUNT {
        (0, u)
    } else {
        let f = usize::BITS - 1 - u.leading_zeros();
        ((f - SL_BITS + 1) as usize, (u >> (f - SL_BITS)) - SL_COUNT)
    }
}

/// The smallest class whose every block is at least `size` bytes; `None` when there is none.
#[inline]
fn search_class(size: usize) -> Option<(usize, usize)> {
    let mut u = size >> GRANULE_SHIFT;
    if u >= SL_COUNT {
        let f = usize::BITS - 1 - u.leading_zeros();
        u = u.checked_add((1usize << (f - SL_BITS)) - 1)?;
    }
    let (fl, sl) = class_of_granules(u);
    (fl < FL_COUNT).then_some((fl, sl))
}

/// One coalescing good-fit free list.
#[derive(Debug)]
pub(crate) struct CoalescingFreeList {
    nodes: Vec<Node>,
    unused: Vec<u32>,
    classes: Classes,
    by_start: AddressMap<usize, u32>,
    by_end: AddressMap<usize, u32>,
    free_bytes: usize,
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
            by_start: AddressMap::default(),
            by_end: AddressMap::default(),
            free_bytes: 0,
        }
    }

    fn new_node(&mut self, addr: usize, size: usize, region: usize) -> u32 {
        let node = Node {
            addr,
            size,
            region,
            prev_free: NIL,
            next_free: NIL,
            used: true,
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
        self.nodes[i as usize].used = false;
        self.unused.push(i);
    }

    /// Puts node `i` into its size class.
    #[inline]
    fn link(&mut self, i: u32) {
        let (fl, sl) = class_of(self.nodes[i as usize].size);
        let slot = fl * SL_COUNT + sl;
        let head = self.classes.heads[slot];
        self.classes.heads[slot] = i;
        self.classes.fl_bitmap |= 1 << fl;
        self.classes.sl_bitmaps[fl] |= 1 << sl;
        if head != NIL {
            self.nodes[head as usize].prev_free = i;
        }
        let n = &mut self.nodes[i as usize];
        n.prev_free = NIL;
        n.next_free = head;
        self.free_bytes += n.size;
    }

    /// Takes node `i` out of its size class (the address maps are the caller's).
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
            let (fl, sl) = class_of(n.size);
            let classes = &mut self.classes;
            classes.heads[fl * SL_COUNT + sl] = n.next_free;
            if n.next_free == NIL {
                classes.sl_bitmaps[fl] &= !(1 << sl);
                if classes.sl_bitmaps[fl] == 0 {
                    classes.fl_bitmap &= !(1 << fl);
                }
            }
        }
        self.free_bytes -= n.size;
    }

    /// Takes node `i` out of the list entirely and returns its block.
    fn remove_node(&mut self, i: u32) -> Block {
        self.unlink(i);
        let n = self.nodes[i as usize];
        self.by_start.remove(&n.addr);
        self.by_end.remove(&(n.addr + n.size));
        self.drop_node(i);
        Block {
            addr: n.addr,
            size: n.size,
            region: n.region,
        }
    }

    /// The free block `take(size)` would use.
    #[inline]
    fn candidate(&self, size: usize) -> Option<u32> {
        let classes = &self.classes;
        let (fl, sl) = class_of(size);
        let mut i = classes.heads[fl * SL_COUNT + sl];
        let mut looked = 0;
        while i != NIL && looked < EXACT_CLASS_SCAN {
            let n = &self.nodes[i as usize];
            if n.size >= size {
                return Some(i);
            }
            i = n.next_free;
            looked += 1;
        }
        let (fl, sl) = search_class(size)?;
        let (fl, sl) = classes.find_from(fl, sl)?;
        Some(classes.heads[fl * SL_COUNT + sl])
    }

    /// Every free node id.
    fn all_free(&self) -> Vec<u32> {
        self.by_start.values().copied().collect()
    }

    /// The free neighbour of the same region ending at `addr`.
    #[inline]
    fn ending_at(&self, addr: usize, region: usize) -> Option<u32> {
        let &p = self.by_end.get(&addr)?;
        (self.nodes[p as usize].region == region).then_some(p)
    }

    /// The free neighbour of the same region starting at `addr`.
    #[inline]
    fn starting_at(&self, addr: usize, region: usize) -> Option<u32> {
        let &n = self.by_start.get(&addr)?;
        (self.nodes[n as usize].region == region).then_some(n)
    }
}

impl FreeList for CoalescingFreeList {
    type Sizing = ();

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

    #[inline]
    fn take(&mut self, size: usize) -> Option<Block> {
        let i = self.candidate(size)?;
        let n = self.nodes[i as usize];
        if n.size == size {
            return Some(self.remove_node(i));
        }
        // Split: the node keeps the tail (its end, so `by_end`, is unchanged).
        self.unlink(i);
        self.by_start.remove(&n.addr);
        {
            let node = &mut self.nodes[i as usize];
            node.addr += size;
            node.size -= size;
        }
        self.by_start.insert(n.addr + size, i);
        self.link(i);
        Some(Block {
            addr: n.addr,
            size,
            region: n.region,
        })
    }

    #[inline]
    fn insert(&mut self, block: Block) {
        let end = block.end();
        let Block { addr, size, region } = block;
        let prev = self.ending_at(addr, region);
        let next = self.starting_at(end, region);
        let at = match (prev, next) {
            (None, None) => {
                let i = self.new_node(addr, size, region);
                self.by_start.insert(addr, i);
                self.by_end.insert(end, i);
                i
            }
            (Some(p), None) => {
                self.unlink(p);
                self.by_end.remove(&addr);
                self.nodes[p as usize].size += size;
                self.by_end.insert(end, p);
                p
            }
            (None, Some(n)) => {
                self.unlink(n);
                self.by_start.remove(&end);
                let node = &mut self.nodes[n as usize];
                node.addr = addr;
                node.size += size;
                self.by_start.insert(addr, n);
                n
            }
            (Some(p), Some(n)) => {
                self.unlink(p);
                self.unlink(n);
                self.by_end.remove(&addr);
                self.by_start.remove(&end);
                let next_size = self.nodes[n as usize].size;
                self.nodes[p as usize].size += size + next_size;
                // The merged block ends where `n` ended: that end now names `p`.
                self.by_end.insert(end + next_size, p);
                self.drop_node(n);
                p
            }
        };
        self.link(at);
    }

    fn drain(&mut self) -> Vec<Block> {
        let out = self
            .all_free()
            .into_iter()
            .map(|i| {
                let n = &self.nodes[i as usize];
                Block {
                    addr: n.addr,
                    size: n.size,
                    region: n.region,
                }
            })
            .collect();
        *self = Self::empty();
        out
    }

    fn absorb_bordering(&mut self, fresh: &mut Self) -> bool {
        let mut moved = false;
        for i in fresh.all_free() {
            let n = fresh.nodes[i as usize];
            if self.ending_at(n.addr, n.region).is_some()
                || self.starting_at(n.addr + n.size, n.region).is_some()
            {
                let block = fresh.remove_node(i);
                self.insert(block);
                moved = true;
            }
        }
        moved
    }

    fn remove_block(&mut self, block: Block) -> bool {
        match self.by_start.get(&block.addr) {
            Some(&i)
                if self.nodes[i as usize].size == block.size
                    && self.nodes[i as usize].region == block.region =>
            {
                self.remove_node(i);
                true
            }
            _ => false,
        }
    }

    fn remove_range(&mut self, addr: usize, size: usize) -> bool {
        let Some(end) = addr.checked_add(size) else {
            return false;
        };
        let found = self.all_free().into_iter().find(|&i| {
            let n = &self.nodes[i as usize];
            n.addr <= addr && end <= n.addr + n.size
        });
        let Some(i) = found else {
            return false;
        };
        let b = self.remove_node(i);
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
        let mut out: Vec<Block> = self
            .all_free()
            .into_iter()
            .map(|i| {
                let n = &self.nodes[i as usize];
                Block {
                    addr: n.addr,
                    size: n.size,
                    region: n.region,
                }
            })
            .collect();
        out.sort_by_key(|b| b.addr);
        out
    }

    fn free_bytes(&self) -> usize {
        self.free_bytes
    }

    fn free_blocks(&self) -> usize {
        self.by_start.len()
    }

    fn largest_free_block(&self) -> usize {
        let mut largest = 0;
        if let Some((fl, sl)) = self.classes.highest() {
            let mut i = self.classes.heads[fl * SL_COUNT + sl];
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
    /// Panics unless every internal invariant holds: every free block is in the class list its
    /// size says and in both address maps, the bitmaps match the class lists, the byte counter
    /// matches, and no two free blocks of one region touch (fully coalesced).
    pub(crate) fn check_invariants(&self) {
        let mut free_bytes = 0;
        let mut free_blocks = 0;
        let classes = &self.classes;
        for fl in 0..FL_COUNT {
            for sl in 0..SL_COUNT {
                let head = classes.heads[fl * SL_COUNT + sl];
                assert_eq!(head != NIL, classes.sl_bitmaps[fl] >> sl & 1 == 1);
                let mut prev = NIL;
                let mut i = head;
                while i != NIL {
                    let n = &self.nodes[i as usize];
                    assert!(n.used);
                    assert_eq!(class_of(n.size), (fl, sl));
                    assert_eq!(n.prev_free, prev);
                    assert!(n.size > 0 && n.size % 256 == 0 && n.addr % 256 == 0);
                    assert_eq!(self.by_start.get(&n.addr), Some(&i));
                    assert_eq!(self.by_end.get(&(n.addr + n.size)), Some(&i));
                    if let Some(&m) = self.by_start.get(&(n.addr + n.size)) {
                        assert_ne!(self.nodes[m as usize].region, n.region, "not coalesced");
                    }
                    free_bytes += n.size;
                    free_blocks += 1;
                    prev = i;
                    i = n.next_free;
                }
            }
            assert_eq!(
                classes.sl_bitmaps[fl] != 0,
                classes.fl_bitmap >> fl & 1 == 1
            );
        }
        assert_eq!(free_bytes, self.free_bytes);
        assert_eq!(free_blocks, self.by_start.len());
        assert_eq!(free_blocks, self.by_end.len());
        assert_eq!(
            free_blocks + self.unused.len(),
            self.nodes.len(),
            "every slot is free or unused"
        );
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

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

        /// Random operations on four lists (0 = fresh) keep every internal invariant, and what
        /// `take` hands out never overlaps and never crosses a chunk.
        #[test]
        fn random_operations_keep_the_invariants(ops in proptest::collection::vec(op(), 1..200)) {
            let mut lists: Vec<CoalescingFreeList> = (0..4).map(|_| CoalescingFreeList::new(&())).collect();
            let mut next_addr = 0x100_0000usize;
            let mut chunks: Vec<Block> = Vec::new();
            let mut live: Vec<Block> = Vec::new();
            let mut trimmed = 0;
            for op in ops {
                match op {
                    Op::Take { list, granules } => {
                        let size = granules * 256;
                        let could = lists[list].can_take(size);
                        let got = lists[list].take(size);
                        prop_assert_eq!(could, got.is_some());
                        if let Some(b) = got {
                            prop_assert_eq!(b.size, size);
                            prop_assert!(chunks.iter().any(|c| c.region == b.region && c.addr <= b.addr && b.end() <= c.end()));
                            prop_assert!(live.iter().all(|q| b.end() <= q.addr || q.end() <= b.addr));
                            live.push(b);
                        }
                    }
                    Op::Give { pick, list } => {
                        if !live.is_empty() {
                            let b = live.swap_remove(pick % live.len());
                            lists[list].insert(b);
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
                }
            }
            let held: usize = chunks.iter().map(|c| c.size).sum();
            let used: usize = live.iter().map(|b| b.size).sum();
            let free: usize = lists.iter().map(|l| l.free_bytes()).sum();
            prop_assert_eq!(free + used + trimmed, held);
            if trimmed == 0 {
                for b in live {
                    lists[1].insert(b);
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
    fn classes_are_monotone_and_search_class_fits() {
        let mut last = (0, 0);
        for u in 1..300usize {
            let c = class_of(u * 256);
            assert!(c >= last, "class of {u} granules went down");
            last = c;
            // Every size in the search class is >= the request.
            let (fl, sl) = search_class(u * 256).unwrap();
            for v in 1..u {
                assert!(class_of(v * 256) < (fl, sl) || (fl, sl) == class_of(v * 256) && v >= u);
            }
        }
        assert_eq!(class_of(256), (0, 1));
        assert_eq!(class_of(32 * 256), (1, 0));
        assert!(search_class(usize::MAX & !255).is_none());
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
