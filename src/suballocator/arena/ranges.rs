//! Ranges carved from regions: the free ones in segregated size classes, every one linked to its
//! neighbours in its region, the taken ones found by start address. The global arena (one
//! region: the whole arena) and every arena (one region per superblock) keep their blocks here.
//!
//! Pure bookkeeping: addresses and sizes on the host, no CUDA, no `unsafe`.
//!
//! # Fit
//! Good fit, in O(1): free ranges sit in size classes (a power of two of 256-byte granules,
//! split in 32 steps), found with two bitmap lookups. [`RangeHeap::take`] looks at the first
//! [`OWN_CLASS_LOOKS`] ranges of the request's own class for one that fits, else takes the first
//! range of the smallest non-empty class whose every range fits: at most `1 + 1/32` times the
//! smallest class that could serve the request.
//!
//! # Ids
//! A region's first range keeps the id [`RangeHeap::add_region`] gave it for as long as the
//! region is here: a split keeps the id on the lower part, and a merge keeps the lower range's.
//! So the owner of a region finds its first range (and whether the region is wholly free) with
//! no lookup.

use super::super::free_lists::size_classes::{
    class_at_least, class_of, class_of_bytes, index, ClassMap, CLASSES, GRANULE_SHIFT,
};
use crate::live::AddressMap;

/// Ranges of the request's own class that [`RangeHeap::take`] looks at.
pub(super) const OWN_CLASS_LOOKS: usize = 4;

/// No range (an empty link).
const NONE: u32 = u32::MAX;

/// What a slot of [`RangeHeap::nodes`] holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// A free range, in its size class.
    Free,
    /// A range handed out, with the owner's tag for what it is.
    Taken(u8),
    /// Nothing: the slot waits for reuse.
    Spare,
}

#[derive(Clone, Copy, Debug)]
struct Node {
    start: usize,
    len: usize,
    region: u32,
    state: State,
    /// The neighbours in the region, by address.
    lower: u32,
    upper: u32,
    /// The neighbours in the size class (free ranges only).
    prev_in_class: u32,
    next_in_class: u32,
}

/// A range taken by [`RangeHeap::take`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Taken {
    /// First address.
    pub start: usize,
    /// Bytes (the request, or the whole free range when the rest was too small to keep).
    pub len: usize,
    /// The region it lies in.
    pub region: u32,
}

/// What [`RangeHeap::give_back`] found at the address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum GiveBack {
    /// The range was taken with this tag and is free now, in this region.
    Done(u32),
    /// No range taken with this tag starts there.
    NotHere,
    /// One does, of this length, not the caller's: nothing changed.
    WrongSize(usize),
}

/// Free and taken ranges of any number of regions; see the module docs.
#[derive(Debug)]
pub(super) struct RangeHeap {
    nodes: Vec<Node>,
    spare: Vec<u32>,
    /// The non-empty classes.
    classes: ClassMap,
    /// The first free range of every class (by `size_classes::index`).
    heads: Vec<u32>,
    /// Taken ranges by start address.
    taken: AddressMap<usize, u32>,
    free_bytes: usize,
    free_ranges: usize,
}

impl Default for RangeHeap {
    fn default() -> Self {
        RangeHeap {
            nodes: Vec::new(),
            spare: Vec::new(),
            classes: ClassMap::default(),
            heads: vec![NONE; CLASSES],
            taken: AddressMap::default(),
            free_bytes: 0,
            free_ranges: 0,
        }
    }
}

impl RangeHeap {
    fn new_node(&mut self, start: usize, len: usize, region: u32) -> u32 {
        let node = Node {
            start,
            len,
            region,
            state: State::Spare,
            lower: NONE,
            upper: NONE,
            prev_in_class: NONE,
            next_in_class: NONE,
        };
        match self.spare.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    fn drop_node(&mut self, i: u32) {
        self.nodes[i as usize].state = State::Spare;
        self.spare.push(i);
    }

    #[inline]
    fn is_free(&self, i: u32) -> bool {
        i != NONE && self.nodes[i as usize].state == State::Free
    }

    /// Marks range `i` free and puts it first in its size class.
    #[inline]
    fn push_free(&mut self, i: u32) {
        let len = self.nodes[i as usize].len;
        let class = class_of_bytes(len);
        let slot = index(class);
        let first = self.heads[slot];
        if first != NONE {
            self.nodes[first as usize].prev_in_class = i;
        }
        let node = &mut self.nodes[i as usize];
        node.state = State::Free;
        node.prev_in_class = NONE;
        node.next_in_class = first;
        self.heads[slot] = i;
        self.classes.mark(class);
        self.free_bytes += len;
        self.free_ranges += 1;
    }

    /// Takes free range `i` out of its size class (its state is the caller's to set).
    #[inline]
    fn pull_free(&mut self, i: u32) {
        let Node {
            len,
            prev_in_class: prev,
            next_in_class: next,
            ..
        } = self.nodes[i as usize];
        if next != NONE {
            self.nodes[next as usize].prev_in_class = prev;
        }
        if prev != NONE {
            self.nodes[prev as usize].next_in_class = next;
        } else {
            let class = class_of_bytes(len);
            self.heads[index(class)] = next;
            if next == NONE {
                self.classes.clear(class);
            }
        }
        self.free_bytes -= len;
        self.free_ranges -= 1;
    }

    /// The free range [`RangeHeap::take`] uses for `need` bytes.
    #[inline]
    fn fit(&self, need: usize) -> Option<u32> {
        let granules = need >> GRANULE_SHIFT;
        let mut i = self.heads[index(class_of(granules))];
        for _ in 0..OWN_CLASS_LOOKS {
            if i == NONE {
                break;
            }
            let node = &self.nodes[i as usize];
            if node.len >= need {
                return Some(i);
            }
            i = node.next_in_class;
        }
        let class = self.classes.first_at_or_above(class_at_least(granules)?)?;
        Some(self.heads[index(class)])
    }

    /// Adds the free region `[start, start + len)` (a multiple of 256 bytes, at least 256) as
    /// region `region`; the id of its first range (see the module docs).
    pub(super) fn add_region(&mut self, start: usize, len: usize, region: u32) -> u32 {
        let i = self.new_node(start, len, region);
        self.push_free(i);
        i
    }

    /// Takes `need` bytes (a multiple of 256) from a free range (see the module docs for which),
    /// as `tag`; the whole range when less than `min_rest` bytes would be left. `None` when no
    /// free range holds `need`.
    ///
    /// # Time Complexity
    /// O(1) (expected, for the hash insert).
    #[inline]
    pub(super) fn take(&mut self, need: usize, min_rest: usize, tag: u8) -> Option<Taken> {
        let i = self.fit(need)?;
        Some(self.carve(i, need, min_rest, tag))
    }

    /// Takes `need` bytes from the start of the free range `i` (a region's first range, from
    /// [`RangeHeap::add_region`]), as [`RangeHeap::take`] does; `None` when it is not free or
    /// too small.
    pub(super) fn take_from(&mut self, i: u32, need: usize, tag: u8) -> Option<Taken> {
        (self.is_free(i) && self.nodes[i as usize].len >= need).then(|| self.carve(i, need, 1, tag))
    }

    /// Takes `need` bytes from the start of free range `i` (see [`RangeHeap::take`]).
    #[inline]
    fn carve(&mut self, i: u32, need: usize, min_rest: usize, tag: u8) -> Taken {
        self.pull_free(i);
        let Node {
            start,
            len,
            region,
            upper,
            ..
        } = self.nodes[i as usize];
        let rest = len - need;
        let len = if rest > 0 && rest >= min_rest {
            let t = self.new_node(start + need, rest, region);
            self.nodes[t as usize].lower = i;
            self.nodes[t as usize].upper = upper;
            if upper != NONE {
                self.nodes[upper as usize].lower = t;
            }
            self.nodes[i as usize].upper = t;
            self.nodes[i as usize].len = need;
            self.push_free(t);
            need
        } else {
            len
        };
        self.nodes[i as usize].state = State::Taken(tag);
        self.taken.insert(start, i);
        Taken { start, len, region }
    }

    /// The length and tag of the range taken at `start`, if one is.
    pub(super) fn taken_at(&self, start: usize) -> Option<(usize, u8)> {
        let &i = self.taken.get(&start)?;
        match self.nodes[i as usize] {
            Node {
                len,
                state: State::Taken(tag),
                ..
            } => Some((len, tag)),
            _ => None,
        }
    }

    /// Frees the range taken as `tag` at `start`, which the caller says has `len` bytes, merging
    /// it with its free neighbours; changes nothing unless such a range is taken there with that
    /// length.
    ///
    /// # Time Complexity
    /// O(1) (expected, for the hash lookup).
    #[inline]
    pub(super) fn give_back(&mut self, start: usize, len: usize, tag: u8) -> GiveBack {
        let std::collections::hash_map::Entry::Occupied(entry) = self.taken.entry(start) else {
            return GiveBack::NotHere;
        };
        let i = *entry.get();
        let node = self.nodes[i as usize];
        if node.state != State::Taken(tag) {
            return GiveBack::NotHere;
        }
        if node.len != len {
            return GiveBack::WrongSize(node.len);
        }
        entry.remove();
        let mut at = i;
        if self.is_free(node.upper) {
            self.pull_free(node.upper);
            self.absorb_upper(i);
        }
        if self.is_free(node.lower) {
            self.pull_free(node.lower);
            self.absorb_upper(node.lower);
            at = node.lower;
        }
        self.push_free(at);
        GiveBack::Done(node.region)
    }

    /// Merges the upper neighbour of range `i` (out of its class) into `i`.
    #[inline]
    fn absorb_upper(&mut self, i: u32) {
        let u = self.nodes[i as usize].upper;
        let Node { len, upper, .. } = self.nodes[u as usize];
        let node = &mut self.nodes[i as usize];
        node.len += len;
        node.upper = upper;
        if upper != NONE {
            self.nodes[upper as usize].lower = i;
        }
        self.drop_node(u);
    }

    /// Whether the region whose first range is `first` is one free range of `len` bytes.
    pub(super) fn is_whole_and_free(&self, first: u32, len: usize) -> bool {
        let node = &self.nodes[first as usize];
        node.state == State::Free && node.len == len
    }

    /// Removes the region whose first range is `first`, which is one free range (see
    /// [`RangeHeap::is_whole_and_free`]).
    pub(super) fn remove_region(&mut self, first: u32) {
        debug_assert!(self.is_free(first) && self.nodes[first as usize].upper == NONE);
        self.pull_free(first);
        self.drop_node(first);
    }

    /// The free ranges of the region whose first range is `first`: (bytes, ranges, largest).
    ///
    /// # Time Complexity
    /// O(ranges of the region).
    pub(super) fn region_free(&self, first: u32) -> (usize, usize, usize) {
        let (mut bytes, mut count, mut largest) = (0, 0, 0);
        let mut i = first;
        while i != NONE {
            let node = &self.nodes[i as usize];
            if node.state == State::Free {
                bytes += node.len;
                count += 1;
                largest = largest.max(node.len);
            }
            i = node.upper;
        }
        (bytes, count, largest)
    }

    /// Free bytes in every region.
    pub(super) fn free_bytes(&self) -> usize {
        self.free_bytes
    }

    /// Number of free ranges.
    #[cfg(test)]
    pub(super) fn free_count(&self) -> usize {
        self.free_ranges
    }

    /// Number of taken ranges.
    pub(super) fn taken_count(&self) -> usize {
        self.taken.len()
    }

    /// The largest free range.
    ///
    /// # Time Complexity
    /// O(ranges of the highest non-empty class).
    pub(super) fn largest_free(&self) -> usize {
        let Some(class) = self.classes.highest() else {
            return 0;
        };
        let mut largest = 0;
        let mut i = self.heads[index(class)];
        while i != NONE {
            largest = largest.max(self.nodes[i as usize].len);
            i = self.nodes[i as usize].next_in_class;
        }
        largest
    }

    /// Every taken range with tag `tag` as (start, length), in address order.
    ///
    /// # Time Complexity
    /// O(n log n) in the ranges.
    pub(super) fn taken_ranges(&self, tag: u8) -> Vec<(usize, usize)> {
        let mut out: Vec<(usize, usize)> = self
            .nodes
            .iter()
            .filter(|n| n.state == State::Taken(tag))
            .map(|n| (n.start, n.len))
            .collect();
        out.sort_unstable();
        out
    }

    /// Every free range as (start, length), in address order.
    ///
    /// # Time Complexity
    /// O(n log n) in the ranges.
    pub(super) fn free_ranges(&self) -> Vec<(usize, usize)> {
        let mut out: Vec<(usize, usize)> = self
            .nodes
            .iter()
            .filter(|n| n.state == State::Free)
            .map(|n| (n.start, n.len))
            .collect();
        out.sort_unstable();
        out
    }
}

#[cfg(test)]
impl RangeHeap {
    /// Panics unless the structure is consistent: neighbour links mutual, contiguous and within
    /// one region; no two free neighbours; every free range in the class its length says, the
    /// bitmaps and counters matching; taken ranges exactly the map's.
    pub(super) fn check(&self) {
        let in_classes = self.classes.check_lists(&self.heads, |i| {
            let n = &self.nodes[i as usize];
            (
                n.state == State::Free,
                n.len,
                n.prev_in_class,
                n.next_in_class,
            )
        });
        assert_eq!(in_classes, (self.free_bytes, self.free_ranges));
        let mut taken = 0;
        for (i, n) in self.nodes.iter().enumerate() {
            let i = i as u32;
            if n.state == State::Spare {
                continue;
            }
            assert!(n.len > 0 && n.len % 256 == 0 && n.start % 256 == 0);
            if n.upper != NONE {
                let u = &self.nodes[n.upper as usize];
                assert_eq!((u.lower, u.start, u.region), (i, n.start + n.len, n.region));
                assert!(!(n.state == State::Free && u.state == State::Free));
            }
            if n.lower != NONE {
                assert_eq!(self.nodes[n.lower as usize].upper, i);
            }
            if matches!(n.state, State::Taken(_)) {
                taken += 1;
                assert_eq!(self.taken.get(&n.start), Some(&i));
            }
        }
        assert_eq!(taken, self.taken.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: usize = 1024;

    #[test]
    fn take_splits_and_give_back_merges_both_sides_within_a_region() {
        let mut h = RangeHeap::default();
        let first = h.add_region(0x10_0000, 64 * KIB, 7);
        let a = h.take(KIB, 1, 1).unwrap();
        let b = h.take(2 * KIB, 1, 1).unwrap();
        let c = h.take(KIB, 1, 1).unwrap();
        assert_eq!(
            (a.start, b.start, c.start),
            (0x10_0000, 0x10_0400, 0x10_0c00)
        );
        assert_eq!((a.len, a.region), (KIB, 7));
        h.check();
        assert_eq!(h.give_back(b.start, KIB, 1), GiveBack::WrongSize(2 * KIB));
        assert_eq!(h.give_back(b.start, 2 * KIB, 2), GiveBack::NotHere, "tag");
        assert_eq!(h.give_back(b.start + 256, 256, 1), GiveBack::NotHere);
        assert_eq!(h.give_back(a.start, KIB, 1), GiveBack::Done(7));
        assert_eq!(h.give_back(c.start, KIB, 1), GiveBack::Done(7));
        assert_eq!(h.free_count(), 2, "b sits between the two free ranges");
        assert_eq!(h.taken_at(b.start), Some((2 * KIB, 1)));
        h.check();
        assert_eq!(h.give_back(b.start, 2 * KIB, 1), GiveBack::Done(7));
        assert_eq!(h.give_back(b.start, 2 * KIB, 1), GiveBack::NotHere);
        assert!(h.is_whole_and_free(first, 64 * KIB));
        assert_eq!(h.region_free(first), (64 * KIB, 1, 64 * KIB));
        h.check();
        h.remove_region(first);
        assert_eq!((h.free_bytes(), h.free_count(), h.taken_count()), (0, 0, 0));
        h.check();
    }

    #[test]
    fn regions_never_merge_and_small_rests_go_with_the_range() {
        let mut h = RangeHeap::default();
        let r0 = h.add_region(0, 4 * KIB, 0);
        let r1 = h.add_region(4 * KIB, 4 * KIB, 1);
        let x = h.take(3 * KIB, 2 * KIB, 9).unwrap();
        assert_eq!(x.len, 4 * KIB, "a 1 KiB rest is below min_rest: taken too");
        let y = h.take(4 * KIB, 1, 9).unwrap();
        assert_ne!(x.region, y.region);
        assert_eq!(h.take(256, 1, 9), None);
        h.give_back(x.start, 4 * KIB, 9);
        h.give_back(y.start, 4 * KIB, 9);
        assert_eq!(
            h.free_ranges(),
            vec![(0, 4 * KIB), (4 * KIB, 4 * KIB)],
            "adjacent regions stay apart"
        );
        assert!(h.is_whole_and_free(r0, 4 * KIB) && h.is_whole_and_free(r1, 4 * KIB));
        assert_eq!(h.largest_free(), 4 * KIB);
        h.check();
    }

    #[test]
    fn the_fit_is_within_one_class_step_of_the_best() {
        let mut h = RangeHeap::default();
        h.add_region(0, 1 << 30, 0);
        // Free ranges of 40, 33 and 65 KiB, separated by taken ones.
        let mut keep = Vec::new();
        let mut free = Vec::new();
        for len in [40 * KIB, 33 * KIB, 65 * KIB] {
            free.push(h.take(len, 1, 0).unwrap());
            keep.push(h.take(KIB, 1, 0).unwrap());
        }
        for t in &free {
            h.give_back(t.start, t.len, 0);
        }
        h.check();
        // 33 KiB: its own class holds 33 KiB (and not 40 KiB): the exact one.
        let t = h.take(33 * KIB, 1, 0).unwrap();
        assert_eq!((t.start, t.len), (free[1].start, 33 * KIB));
        // 34 KiB: no range of its class fits; the next class up holds 40 KiB.
        let t = h.take(34 * KIB, 1, 0).unwrap();
        assert_eq!(t.start, free[0].start);
        h.check();
    }

    #[test]
    fn random_takes_and_gives_keep_the_structure_and_coalesce_fully() {
        let mut h = RangeHeap::default();
        let firsts: Vec<u32> = (0..4u32)
            .map(|r| h.add_region(r as usize * (8 << 20), 8 << 20, r))
            .collect();
        let mut live: Vec<Taken> = Vec::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for step in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if live.is_empty() || x % 5 < 3 {
                let need = ((x >> 8) as usize % (600 * KIB) + 1).div_ceil(256) * 256;
                if let Some(t) = h.take(need, 1, 3) {
                    assert_eq!(t.len, need);
                    live.push(t);
                }
            } else {
                let t = live.swap_remove((x >> 20) as usize % live.len());
                assert_eq!(h.give_back(t.start, t.len, 3), GiveBack::Done(t.region));
            }
            if step % 997 == 0 {
                h.check();
            }
        }
        for t in live.drain(..) {
            h.give_back(t.start, t.len, 3);
        }
        h.check();
        for (r, &first) in firsts.iter().enumerate() {
            assert!(h.is_whole_and_free(first, 8 << 20), "region {r}");
        }
    }
}
