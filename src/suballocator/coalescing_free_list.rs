//! The pool's strategy: a coalescing TLSF-style free list with one set of size classes per
//! stream, in O(1) per operation.
//!
//! Every block (free or allocated) is a node in one arena; nodes of one upstream chunk are linked
//! by address (`prev_phys`/`next_phys`), and the links stop at chunk boundaries, so blocks never
//! coalesce across two upstream allocations. Free blocks sit in segregated size classes (64 - 8
//! first-level classes by power of two of the size in 256-byte granules, each split in 32
//! second-level classes), found with two bitmap lookups. Allocated blocks are found by address in
//! a hash map.
//!
//! # Fit
//! Good fit, not exact best fit: `take` first looks at up to [`EXACT_CLASS_SCAN`] blocks of the
//! request's own size class for one that fits, then takes the first block of the smallest
//! non-empty class whose every block fits. The block chosen is at most `1 + 1/32` times the best
//! fit's size class bound, except when the best fit is in the request's own class beyond the
//! blocks looked at.
//!
//! # Time Complexity
//! `take`, `give_back` and `add_chunk` are O(1) (bitmap scans of 64 bits, a bounded class scan,
//! expected O(1) hash operations). Merging all lists, removing free chunks and the largest-block
//! figure are O(free blocks) and only run on rare paths.

#![deny(unsafe_code)]

use super::stream_ordered::{BlockLists, FreeList, ListId, FRESH};
use crate::error::{Error, Result};
use crate::resource::{align_up, ALLOCATION_ALIGNMENT};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

const GRANULE_SHIFT: u32 = 8;
const SL_BITS: u32 = 5;
const SL_COUNT: usize = 1 << SL_BITS;
/// First-level classes: sizes up to 2^64 in 256-byte granules.
const FL_COUNT: usize = (usize::BITS - GRANULE_SHIFT - SL_BITS + 1) as usize;
/// How many blocks of the request's own size class `take` looks at for a fit.
pub(crate) const EXACT_CLASS_SCAN: usize = 4;

const NIL: u32 = u32::MAX;
/// `Node::list` of an allocated block.
const ALLOCATED: u32 = u32::MAX;
/// `Node::list` of an arena slot that holds no block.
const UNUSED: u32 = u32::MAX - 1;

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

#[derive(Clone, Copy, Debug)]
struct Node {
    addr: usize,
    size: usize,
    prev_phys: u32,
    next_phys: u32,
    prev_free: u32,
    next_free: u32,
    /// The free list holding this block, [`ALLOCATED`] or [`UNUSED`].
    list: u32,
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

/// Coalescing good-fit free lists, one per stream, over one arena of block nodes.
#[derive(Debug)]
pub(crate) struct CoalescingFreeList {
    nodes: Vec<Node>,
    unused: Vec<u32>,
    lists: Vec<Classes>,
    allocated: AddressMap<usize, u32>,
    free_bytes: usize,
    free_blocks: usize,
}

impl Default for CoalescingFreeList {
    fn default() -> Self {
        Self::new()
    }
}

impl CoalescingFreeList {
    /// Empty lists, with the fresh list (id [`FRESH`]) only.
    pub(crate) fn new() -> Self {
        CoalescingFreeList {
            nodes: Vec::new(),
            unused: Vec::new(),
            lists: vec![Classes::new()],
            allocated: AddressMap::default(),
            free_bytes: 0,
            free_blocks: 0,
        }
    }

    fn new_node(&mut self, addr: usize, size: usize) -> u32 {
        let node = Node {
            addr,
            size,
            prev_phys: NIL,
            next_phys: NIL,
            prev_free: NIL,
            next_free: NIL,
            list: UNUSED,
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
        self.nodes[i as usize].list = UNUSED;
        self.unused.push(i);
    }

    #[inline]
    fn is_free(&self, i: u32) -> bool {
        i != NIL && self.nodes[i as usize].list < UNUSED
    }

    #[inline]
    fn insert_free(&mut self, i: u32, list: ListId) {
        let (fl, sl) = class_of(self.nodes[i as usize].size);
        let classes = &mut self.lists[list as usize];
        let slot = fl * SL_COUNT + sl;
        let head = classes.heads[slot];
        classes.heads[slot] = i;
        classes.fl_bitmap |= 1 << fl;
        classes.sl_bitmaps[fl] |= 1 << sl;
        if head != NIL {
            self.nodes[head as usize].prev_free = i;
        }
        let n = &mut self.nodes[i as usize];
        n.prev_free = NIL;
        n.next_free = head;
        n.list = list;
        self.free_bytes += n.size;
        self.free_blocks += 1;
    }

    #[inline]
    fn remove_free(&mut self, i: u32) {
        let n = self.nodes[i as usize];
        if n.prev_free != NIL {
            self.nodes[n.prev_free as usize].next_free = n.next_free;
        }
        if n.next_free != NIL {
            self.nodes[n.next_free as usize].prev_free = n.prev_free;
        }
        if n.prev_free == NIL {
            let (fl, sl) = class_of(n.size);
            let classes = &mut self.lists[n.list as usize];
            classes.heads[fl * SL_COUNT + sl] = n.next_free;
            if n.next_free == NIL {
                classes.sl_bitmaps[fl] &= !(1 << sl);
                if classes.sl_bitmaps[fl] == 0 {
                    classes.fl_bitmap &= !(1 << fl);
                }
            }
        }
        self.free_bytes -= n.size;
        self.free_blocks -= 1;
        self.nodes[i as usize].list = ALLOCATED;
    }

    /// The free block `take(list, size)` would use.
    #[inline]
    fn candidate(&self, list: ListId, size: usize) -> Option<u32> {
        let classes = self.lists.get(list as usize)?;
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

    /// Every free node id, of every list.
    fn all_free(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.free_blocks);
        for classes in &self.lists {
            for &head in &classes.heads {
                let mut i = head;
                while i != NIL {
                    out.push(i);
                    i = self.nodes[i as usize].next_free;
                }
            }
        }
        out
    }

    /// Merges free block `b` (the physical successor of `a`) into `a`; both out of the lists.
    fn absorb_next(&mut self, a: u32, b: u32) {
        let nb = self.nodes[b as usize];
        let na = &mut self.nodes[a as usize];
        na.size += nb.size;
        na.next_phys = nb.next_phys;
        if nb.next_phys != NIL {
            self.nodes[nb.next_phys as usize].prev_phys = a;
        }
        self.drop_node(b);
    }
}

impl FreeList for CoalescingFreeList {
    fn block_size_for(&self, bytes: usize) -> Result<usize> {
        align_up(bytes, ALLOCATION_ALIGNMENT)
            .ok_or_else(|| Error::out_of_memory(bytes, "request size overflows"))
    }

    fn add_list(&mut self) -> ListId {
        self.lists.push(Classes::new());
        (self.lists.len() - 1) as ListId
    }

    fn can_take(&self, list: ListId, size: usize) -> bool {
        self.candidate(list, size).is_some()
    }

    fn take(&mut self, list: ListId, size: usize) -> Option<usize> {
        let i = self.candidate(list, size)?;
        self.remove_free(i);
        let n = self.nodes[i as usize];
        if n.size > size {
            let rest = self.new_node(n.addr + size, n.size - size);
            {
                let r = &mut self.nodes[rest as usize];
                r.prev_phys = i;
                r.next_phys = n.next_phys;
            }
            if n.next_phys != NIL {
                self.nodes[n.next_phys as usize].prev_phys = rest;
            }
            let node = &mut self.nodes[i as usize];
            node.next_phys = rest;
            node.size = size;
            self.insert_free(rest, list);
        }
        self.allocated.insert(n.addr, i);
        Some(n.addr)
    }

    fn give_back(&mut self, list: ListId, addr: usize, _size: usize) -> Result<()> {
        let Some(mut i) = self.allocated.remove(&addr) else {
            return Err(Error::Logic(format!(
                "deallocate of {addr:#x}, which this resource did not allocate (or was freed)"
            )));
        };
        let mergeable = |s: &Self, j: u32| s.is_free(j) && s.nodes[j as usize].list == list;
        let prev = self.nodes[i as usize].prev_phys;
        if mergeable(self, prev) {
            self.remove_free(prev);
            self.absorb_next(prev, i);
            i = prev;
        }
        let next = self.nodes[i as usize].next_phys;
        if mergeable(self, next) {
            self.remove_free(next);
            self.absorb_next(i, next);
        }
        self.insert_free(i, list);
        Ok(())
    }

    fn add_chunk(&mut self, addr: usize, size: usize) {
        let i = self.new_node(addr, size);
        self.insert_free(i, FRESH);
    }

    fn absorb_fresh_neighbours(&mut self, list: ListId) -> bool {
        if list == FRESH {
            return false;
        }
        let fresh: Vec<u32> = {
            let classes = &self.lists[FRESH as usize];
            let mut out = Vec::new();
            for &head in &classes.heads {
                let mut i = head;
                while i != NIL {
                    out.push(i);
                    i = self.nodes[i as usize].next_free;
                }
            }
            out
        };
        let in_list = |s: &Self, j: u32| s.is_free(j) && s.nodes[j as usize].list == list;
        let mut merged = false;
        for f in fresh {
            let prev = self.nodes[f as usize].prev_phys;
            let next = self.nodes[f as usize].next_phys;
            let (take_prev, take_next) = (in_list(self, prev), in_list(self, next));
            if !take_prev && !take_next {
                continue;
            }
            self.remove_free(f);
            let mut at = f;
            if take_prev {
                self.remove_free(prev);
                self.absorb_next(prev, f);
                at = prev;
            }
            if take_next {
                self.remove_free(next);
                self.absorb_next(at, next);
            }
            self.insert_free(at, list);
            merged = true;
        }
        merged
    }

    fn merge_all_into_fresh(&mut self) {
        let free = self.all_free();
        for &i in &free {
            self.remove_free(i);
        }
        // Every block is now out of the lists (marked ALLOCATED); mark the free ones FRESH.
        for &i in &free {
            self.nodes[i as usize].list = FRESH;
        }
        let mut starts = Vec::with_capacity(free.len());
        for &i in &free {
            if self.nodes[i as usize].list != FRESH
                || self.is_free(self.nodes[i as usize].prev_phys)
            {
                continue; // absorbed already, or not the first of a run of free blocks
            }
            loop {
                let next = self.nodes[i as usize].next_phys;
                if !self.is_free(next) {
                    break;
                }
                self.absorb_next(i, next);
            }
            starts.push(i);
        }
        for i in starts {
            self.insert_free(i, FRESH);
        }
    }

    fn remove_free_chunks(&mut self) -> Vec<(usize, usize)> {
        let whole: Vec<u32> = self
            .all_free()
            .into_iter()
            .filter(|&i| {
                let n = &self.nodes[i as usize];
                n.prev_phys == NIL && n.next_phys == NIL
            })
            .collect();
        whole
            .into_iter()
            .map(|i| {
                self.remove_free(i);
                let n = self.nodes[i as usize];
                self.drop_node(i);
                (n.addr, n.size)
            })
            .collect()
    }

    fn free_bytes(&self) -> usize {
        self.free_bytes
    }

    fn blocks(&self) -> BlockLists {
        let (mut allocated, mut free) = (Vec::new(), Vec::new());
        for n in &self.nodes {
            match n.list {
                UNUSED => {}
                ALLOCATED => allocated.push((n.addr, n.size)),
                _ => free.push((n.addr, n.size)),
            }
        }
        (allocated, free)
    }

    fn free_blocks(&self) -> usize {
        self.free_blocks
    }

    fn largest_free_block(&self) -> usize {
        let mut largest = 0;
        for classes in &self.lists {
            if let Some((fl, sl)) = classes.highest() {
                let mut i = classes.heads[fl * SL_COUNT + sl];
                while i != NIL {
                    largest = largest.max(self.nodes[i as usize].size);
                    i = self.nodes[i as usize].next_free;
                }
            }
        }
        largest
    }
}

#[cfg(test)]
impl CoalescingFreeList {
    /// Panics unless every internal invariant holds: physical links are mutual and contiguous,
    /// every free block is in the class list its size and list id say, the bitmaps match the
    /// class lists, the counters match, allocated blocks are exactly the map's.
    fn check_invariants(&self) {
        let mut free_bytes = 0;
        let mut free_blocks = 0;
        for (l, classes) in self.lists.iter().enumerate() {
            for fl in 0..FL_COUNT {
                for sl in 0..SL_COUNT {
                    let head = classes.heads[fl * SL_COUNT + sl];
                    assert_eq!(head != NIL, classes.sl_bitmaps[fl] >> sl & 1 == 1);
                    let mut prev = NIL;
                    let mut i = head;
                    while i != NIL {
                        let n = &self.nodes[i as usize];
                        assert_eq!(n.list as usize, l);
                        assert_eq!(class_of(n.size), (fl, sl));
                        assert_eq!(n.prev_free, prev);
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
        }
        assert_eq!(
            (free_bytes, free_blocks),
            (self.free_bytes, self.free_blocks)
        );
        let mut allocated = 0;
        for (i, n) in self.nodes.iter().enumerate() {
            if n.list == UNUSED {
                continue;
            }
            assert!(n.size > 0 && n.size % 256 == 0 && n.addr % 256 == 0);
            if n.next_phys != NIL {
                let m = &self.nodes[n.next_phys as usize];
                assert_eq!(m.prev_phys as usize, i);
                assert_eq!(n.addr + n.size, m.addr);
            }
            if n.prev_phys != NIL {
                assert_eq!(self.nodes[n.prev_phys as usize].next_phys as usize, i);
            }
            if n.list == ALLOCATED {
                allocated += 1;
                assert_eq!(self.allocated.get(&n.addr), Some(&(i as u32)));
            }
        }
        assert_eq!(allocated, self.allocated.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        Take { list: u32, granules: usize },
        Give { pick: usize, list: u32 },
        Chunk { granules: usize },
        MergeAll,
        RemoveFreeChunks,
        AbsorbFresh { list: u32 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0..4u32, 1..200usize).prop_map(|(list, granules)| Op::Take { list, granules }),
            5 => (any::<usize>(), 0..4u32).prop_map(|(pick, list)| Op::Give { pick, list }),
            1 => (1..2000usize).prop_map(|granules| Op::Chunk { granules }),
            1 => Just(Op::MergeAll),
            1 => Just(Op::RemoveFreeChunks),
            1 => (0..4u32).prop_map(|list| Op::AbsorbFresh { list }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

        /// Random operations keep every internal invariant, and what `take` hands out never
        /// overlaps and never crosses a chunk.
        #[test]
        fn random_operations_keep_the_invariants(ops in proptest::collection::vec(op(), 1..200)) {
            let mut fl = CoalescingFreeList::new();
            for _ in 1..4 {
                fl.add_list();
            }
            let mut next_addr = 0x100_0000usize;
            let mut chunks: Vec<(usize, usize)> = Vec::new();
            let mut live: Vec<(usize, usize)> = Vec::new();
            for op in ops {
                match op {
                    Op::Take { list, granules } => {
                        let size = granules * 256;
                        let could = fl.can_take(list, size);
                        let got = fl.take(list, size);
                        prop_assert_eq!(could, got.is_some());
                        if let Some(p) = got {
                            prop_assert!(chunks.iter().any(|&(a, n)| a <= p && p + size <= a + n));
                            prop_assert!(live.iter().all(|&(q, m)| p + size <= q || q + m <= p));
                            live.push((p, size));
                        }
                    }
                    Op::Give { pick, list } => {
                        if !live.is_empty() {
                            let (p, size) = live.swap_remove(pick % live.len());
                            fl.give_back(list, p, size).unwrap();
                        }
                    }
                    Op::Chunk { granules } => {
                        // Chunks sometimes adjacent, to check they stay apart.
                        let size = granules * 256;
                        fl.add_chunk(next_addr, size);
                        chunks.push((next_addr, size));
                        next_addr += size + if granules % 2 == 0 { 0 } else { 4096 };
                    }
                    Op::MergeAll => fl.merge_all_into_fresh(),
                    Op::AbsorbFresh { list } => {
                        let before = fl.free_bytes();
                        fl.absorb_fresh_neighbours(list);
                        prop_assert_eq!(fl.free_bytes(), before);
                    }
                    Op::RemoveFreeChunks => {
                        for (a, n) in fl.remove_free_chunks() {
                            let at = chunks.iter().position(|&c| c == (a, n));
                            prop_assert!(at.is_some(), "removed a block that is not a whole chunk");
                            chunks.swap_remove(at.unwrap_or(0));
                        }
                    }
                }
                fl.check_invariants();
            }
            let held: usize = chunks.iter().map(|&(_, n)| n).sum();
            let used: usize = live.iter().map(|&(_, n)| n).sum();
            prop_assert_eq!(fl.free_bytes() + used, held);
            for (p, size) in live {
                fl.give_back(FRESH, p, size).unwrap();
            }
            fl.merge_all_into_fresh();
            prop_assert_eq!(fl.free_blocks(), chunks.len());
            fl.check_invariants();
        }
    }

    #[test]
    fn classes_are_monotone_and_search_class_fits() {
        let mut last = (0, 0);
        for u in 1..5000usize {
            let c = class_of(u * 256);
            assert!(c >= last, "class of {u} granules went down");
            last = c;
            // Every size in the search class is >= the request.
            let (fl, sl) = search_class(u * 256).unwrap();
            for v in 1..u {
                assert!(class_of(v * 256) < (fl, sl) || (fl, sl) == class_of(v * 256) && v >= u);
            }
            if u > 300 {
                break;
            }
        }
        assert_eq!(class_of(256), (0, 1));
        assert_eq!(class_of(32 * 256), (1, 0));
        assert!(search_class(usize::MAX & !255).is_none());
    }

    #[test]
    fn split_coalesce_and_chunk_boundaries() {
        let mut fl = CoalescingFreeList::new();
        fl.add_chunk(0x10000, 4096);
        fl.add_chunk(0x10000 + 4096, 4096); // adjacent but a different upstream chunk
        let a = fl.take(FRESH, 1024).unwrap();
        let b = fl.take(FRESH, 1024).unwrap();
        assert_eq!(b, a + 1024);
        assert_eq!(fl.free_bytes(), 8192 - 2048);
        fl.give_back(FRESH, a, 1024).unwrap();
        fl.give_back(FRESH, b, 1024).unwrap();
        assert_eq!(fl.free_blocks(), 2, "never coalesce across chunks");
        assert_eq!(fl.largest_free_block(), 4096);
        assert!(
            fl.give_back(FRESH, a, 1024).is_err(),
            "double free is an error"
        );
        assert_eq!(fl.remove_free_chunks().len(), 2);
        assert_eq!(fl.free_bytes(), 0);
    }

    #[test]
    fn streams_keep_their_blocks_until_merged() {
        let mut fl = CoalescingFreeList::new();
        let s1 = fl.add_list();
        let s2 = fl.add_list();
        fl.add_chunk(0x10000, 3 * 256);
        let a = fl.take(FRESH, 256).unwrap();
        let b = fl.take(FRESH, 256).unwrap();
        let c = fl.take(FRESH, 256).unwrap();
        fl.give_back(s1, a, 256).unwrap();
        fl.give_back(s2, b, 256).unwrap();
        fl.give_back(s1, c, 256).unwrap();
        assert_eq!(fl.free_blocks(), 3);
        assert!(!fl.can_take(s2, 512) && !fl.can_take(FRESH, 256));
        assert_eq!(fl.take(s2, 256), Some(b));
        fl.give_back(s2, b, 256).unwrap();
        fl.merge_all_into_fresh();
        assert_eq!(fl.free_blocks(), 1);
        assert_eq!(fl.take(FRESH, 768), Some(a));
    }
}
