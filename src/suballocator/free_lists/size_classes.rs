//! Two-level size classes of 256-byte granules, shared by the pool's coalescing free list and
//! the arena's range heap: sizes below 32 granules have a class each; above, every power of two
//! is split into 32 steps. [`ClassMap`] marks the non-empty classes, so the first non-empty class
//! at or above a given one, and the highest one, are found in O(1) with two bit scans.

#![deny(unsafe_code)]

/// Bits of a granule (256 bytes, the allocation alignment).
pub(crate) const GRANULE_SHIFT: u32 = 8;
/// Bits of the steps each power of two is split into.
const STEP_BITS: u32 = 5;
/// Steps per power of two.
pub(crate) const STEPS: usize = 1 << STEP_BITS;
/// Powers of two of granules (the first one holds every size below `STEPS` granules).
pub(crate) const POWERS: usize = (usize::BITS - GRANULE_SHIFT - STEP_BITS + 1) as usize;
/// Number of classes (the length of a table of class heads).
pub(crate) const CLASSES: usize = POWERS * STEPS;

/// A class: (power, step).
pub(crate) type Class = (usize, usize);

/// The index of `class` in a table of [`CLASSES`] heads.
#[inline]
pub(crate) fn index((power, step): Class) -> usize {
    power * STEPS + step
}

/// The class of a block of `granules` 256-byte granules.
#[inline]
pub(crate) fn class_of(granules: usize) -> Class {
    if granules < STEPS {
        (0, granules)
    } else {
        let top = usize::BITS - 1 - granules.leading_zeros();
        let shift = top - STEP_BITS;
        ((shift + 1) as usize, (granules >> shift) - STEPS)
    }
}

/// The class of a block of `bytes` (a multiple of 256).
#[inline]
pub(crate) fn class_of_bytes(bytes: usize) -> Class {
    class_of(bytes >> GRANULE_SHIFT)
}

/// The smallest class whose every block holds at least `granules`; `None` past the last class.
#[inline]
pub(crate) fn class_at_least(granules: usize) -> Option<Class> {
    let mut g = granules;
    if g >= STEPS {
        let shift = usize::BITS - 1 - g.leading_zeros() - STEP_BITS;
        g = g.checked_add((1 << shift) - 1)?;
    }
    let (power, step) = class_of(g);
    (power < POWERS).then_some((power, step))
}

/// The granules of the smallest block of `class` (every block of the class holds at least
/// this many).
#[inline]
pub(crate) fn class_floor((power, step): Class) -> usize {
    if power == 0 {
        step
    } else {
        (STEPS + step) << (power - 1)
    }
}

/// `bytes` (> 0) rounded up to the smallest class floor that holds it, in bytes: at most 1/32
/// more above 8 KiB, 256-byte steps below; `None` past the last class.
#[inline]
pub(crate) fn round_up_to_class(bytes: usize) -> Option<usize> {
    let granules = bytes.checked_add((1 << GRANULE_SHIFT) - 1)? >> GRANULE_SHIFT;
    class_floor(class_at_least(granules)?).checked_mul(1 << GRANULE_SHIFT)
}

/// Which classes are non-empty: a bit per power, and per power a bit per step.
#[derive(Clone, Debug)]
pub(crate) struct ClassMap {
    powers: u64,
    steps: [u32; POWERS],
}

impl Default for ClassMap {
    fn default() -> Self {
        ClassMap {
            powers: 0,
            steps: [0; POWERS],
        }
    }
}

impl ClassMap {
    /// Marks `class` non-empty.
    #[inline]
    pub(crate) fn mark(&mut self, (power, step): Class) {
        self.powers |= 1 << power;
        self.steps[power] |= 1 << step;
    }

    /// Marks `class` empty.
    #[inline]
    pub(crate) fn clear(&mut self, (power, step): Class) {
        self.steps[power] &= !(1 << step);
        if self.steps[power] == 0 {
            self.powers &= !(1 << power);
        }
    }

    /// Whether `class` is marked.
    #[cfg(test)]
    pub(crate) fn is_marked(&self, (power, step): Class) -> bool {
        self.steps[power] >> step & 1 == 1
    }

    /// Whether the power's bit agrees with its steps (for consistency checks).
    #[cfg(test)]
    pub(crate) fn power_consistent(&self, power: usize) -> bool {
        (self.steps[power] != 0) == (self.powers >> power & 1 == 1)
    }

    /// The first non-empty class at or above `class`.
    #[inline]
    pub(crate) fn first_at_or_above(&self, (power, step): Class) -> Option<Class> {
        let in_power = self.steps[power] & (!0u32 << step);
        if in_power != 0 {
            return Some((power, in_power.trailing_zeros() as usize));
        }
        let above = self.powers & (!0u64).checked_shl(power as u32 + 1).unwrap_or(0);
        if above == 0 {
            return None;
        }
        let p = above.trailing_zeros() as usize;
        Some((p, self.steps[p].trailing_zeros() as usize))
    }

    /// The first non-empty class above `class`.
    #[inline]
    fn next_above(&self, (power, step): Class) -> Option<Class> {
        if step + 1 < STEPS {
            self.first_at_or_above((power, step + 1))
        } else if power + 1 < POWERS {
            self.first_at_or_above((power + 1, 0))
        } else {
            None
        }
    }

    /// Every non-empty class, lowest first.
    #[cfg(test)]
    pub(crate) fn marked(&self) -> impl Iterator<Item = Class> + '_ {
        self.marked_from((0, 0))
    }

    /// Every non-empty class at or above `class`, lowest first (two bit scans each).
    pub(crate) fn marked_from(&self, class: Class) -> impl Iterator<Item = Class> + '_ {
        std::iter::successors(self.first_at_or_above(class), move |&c| self.next_above(c))
    }

    /// Panics unless the class lists of a segregated free list agree with this map (tests): the
    /// first node of each class is `heads[index(class)]`, `node(i)` is node `i`'s (whether it is
    /// free, its bytes, the previous and the next node of its class), and `u32::MAX` ends a list.
    /// Each list is doubly linked, holds free nodes of its class only, and is non-empty exactly
    /// where the map is marked. Returns the bytes and the number of the nodes in the lists.
    #[cfg(test)]
    pub(crate) fn check_lists(
        &self,
        heads: &[u32],
        node: impl Fn(u32) -> (bool, usize, u32, u32),
    ) -> (usize, usize) {
        const END: u32 = u32::MAX;
        let (mut bytes, mut count) = (0, 0);
        for power in 0..POWERS {
            for step in 0..STEPS {
                let mut prev = END;
                let mut i = heads[index((power, step))];
                assert_eq!(i != END, self.is_marked((power, step)));
                while i != END {
                    let (free, len, prev_in_class, next_in_class) = node(i);
                    assert!(free, "node {i} of class ({power}, {step}) is not free");
                    assert_eq!(class_of_bytes(len), (power, step));
                    assert_eq!(prev_in_class, prev);
                    bytes += len;
                    count += 1;
                    prev = i;
                    i = next_in_class;
                }
            }
            assert!(self.power_consistent(power));
        }
        (bytes, count)
    }

    /// The highest non-empty class.
    pub(crate) fn highest(&self) -> Option<Class> {
        if self.powers == 0 {
            return None;
        }
        let p = 63 - self.powers.leading_zeros() as usize;
        Some((p, 31 - self.steps[p].leading_zeros() as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_every_size_once_and_searches_round_up() {
        assert_eq!(class_of(1), (0, 1));
        assert_eq!(class_of(31), (0, 31));
        assert_eq!(class_of(32), (1, 0));
        assert_eq!(class_of(63), (1, 31));
        assert_eq!(class_of(64), (2, 0));
        assert_eq!(class_of(65), (2, 0));
        assert_eq!(class_of(66), (2, 1));
        assert_eq!(class_at_least(65), Some((2, 1)));
        assert_eq!(class_at_least(64), Some((2, 0)));
        assert_eq!(class_of(usize::MAX >> GRANULE_SHIFT).0, POWERS - 1);
        assert_eq!(class_at_least(usize::MAX >> GRANULE_SHIFT), None);
        assert_eq!(class_of_bytes(64 << GRANULE_SHIFT), (2, 0));
    }

    #[test]
    fn the_map_finds_the_first_class_above_and_the_highest() {
        let mut m = ClassMap::default();
        assert_eq!(m.first_at_or_above((0, 0)), None);
        assert_eq!(m.highest(), None);
        m.mark((1, 5));
        m.mark((3, 2));
        assert!(m.is_marked((1, 5)) && !m.is_marked((1, 4)));
        assert_eq!(m.first_at_or_above((0, 7)), Some((1, 5)));
        assert_eq!(m.first_at_or_above((1, 5)), Some((1, 5)));
        assert_eq!(m.first_at_or_above((1, 6)), Some((3, 2)));
        assert_eq!(m.highest(), Some((3, 2)));
        m.clear((3, 2));
        assert_eq!(m.highest(), Some((1, 5)));
        assert_eq!(m.first_at_or_above((1, 6)), None);
        assert!((0..POWERS).all(|p| m.power_consistent(p)));
        m.mark((0, 3));
        assert_eq!(m.marked().collect::<Vec<_>>(), vec![(0, 3), (1, 5)]);
    }

    #[test]
    fn classes_are_monotone_and_search_class_fits() {
        let mut last = (0, 0);
        for u in 1..300usize {
            let c = class_of_bytes(u * 256);
            assert!(c >= last, "class of {u} granules went down");
            last = c;
            // Every size in the search class is >= the request.
            let (fl, sl) = class_at_least(u).unwrap();
            for v in 1..u {
                let cv = class_of_bytes(v * 256);
                assert!(cv < (fl, sl) || (fl, sl) == cv && v >= u);
            }
        }
        assert_eq!(class_of_bytes(256), (0, 1));
        assert_eq!(class_of_bytes(32 * 256), (1, 0));
        assert!(class_at_least((usize::MAX & !255) >> 8).is_none());
    }

    #[test]
    fn rounding_up_to_a_class_floor_wastes_at_most_a_32nd() {
        for bytes in (1..20_000usize).chain((0..2000).map(|i| 1 + i * 7_777_777)) {
            let rounded = round_up_to_class(bytes).unwrap();
            assert!(
                rounded >= bytes && rounded % 256 == 0,
                "{bytes} -> {rounded}"
            );
            assert!(
                rounded - bytes < 256 || (rounded - bytes) * 32 <= bytes,
                "{bytes} -> {rounded}"
            );
            // A class floor rounds to itself, and its class is the class of its bytes.
            assert_eq!(round_up_to_class(rounded), Some(rounded));
            assert_eq!(class_floor(class_of_bytes(rounded)) * 256, rounded);
        }
        assert_eq!(round_up_to_class(usize::MAX), None);
    }
}
