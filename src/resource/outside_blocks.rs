//! The live blocks of a resource whose addresses come from outside rrmm (the user's functions):
//! every block it hands out is checked against the others before anything uses it, and every
//! free against the record.

use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::collections::BTreeMap;

/// Live blocks by start address, refusing a block that overlaps a live one.
///
/// rrmm's own resources never hand out one byte twice; a function of the user's can (a pointer
/// returned twice, or a block inside another): suballocators over it would then give two users
/// the same memory. Zero-byte blocks take no bytes and are not recorded.
///
/// # Time Complexity
/// O(log n) per call in the number of live blocks, under one lock (the functions it guards cost
/// far more: they call Python).
#[derive(Debug, Default)]
pub(crate) struct OutsideBlocks {
    /// start -> bytes, of every live block of a positive size.
    live: Mutex<BTreeMap<usize, usize>>,
    /// Set by [`release_all`](Self::release_all): the memory was given back elsewhere, so a
    /// later free of a block that is not live is a no-op.
    released: std::sync::atomic::AtomicBool,
}

impl OutsideBlocks {
    /// The live block that `[ptr, ptr + bytes)` overlaps, if any.
    fn overlapping(
        live: &BTreeMap<usize, usize>,
        ptr: usize,
        bytes: usize,
    ) -> Option<(usize, usize)> {
        let end = ptr.saturating_add(bytes);
        live.range(..end)
            .next_back()
            .filter(|&(&start, &len)| start.saturating_add(len) > ptr)
            .map(|(&start, &len)| (start, len))
    }

    /// Records `[ptr, ptr + bytes)`, just handed out by `who`.
    ///
    /// # Errors
    /// [`Error::Logic`] naming both blocks when it overlaps a live block (the caller must not
    /// use it, nor free it: rrmm cannot know what it is).
    pub(crate) fn admit(&self, who: &str, ptr: usize, bytes: usize) -> Result<()> {
        if bytes == 0 || ptr == 0 {
            return Ok(());
        }
        let mut live = self.live.lock();
        if let Some((start, len)) = Self::overlapping(&live, ptr, bytes) {
            return Err(Error::Logic(format!(
                "{who}: the allocate function returned {ptr:#x} ({bytes} bytes), which overlaps \
                 the live block {start:#x} ({len} bytes) it returned before: two users would \
                 share memory (rrmm does not use or free it)"
            )));
        }
        live.insert(ptr, bytes);
        Ok(())
    }

    /// Frees `[ptr, ptr + bytes)` through `free` when it is live with exactly `bytes`: the record
    /// is taken first (a concurrent double free fails on one side) and put back when `free`
    /// fails. A zero-byte or null block goes to `free` unchecked; a block that is not live
    /// after [`release_all`](Self::release_all) is a no-op.
    ///
    /// # Errors
    /// [`Error::Logic`] for a block that is not live or a size other than its own (nothing is
    /// called); `free`'s error.
    pub(crate) fn free(
        &self,
        who: &str,
        ptr: usize,
        bytes: usize,
        free: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        if bytes == 0 || ptr == 0 {
            return free();
        }
        {
            let mut live = self.live.lock();
            match live.get(&ptr) {
                Some(&len) if len == bytes => {
                    live.remove(&ptr);
                }
                Some(&len) => {
                    return Err(Error::Logic(format!(
                        "{who}: deallocate of {ptr:#x} with {bytes} bytes, but it was allocated \
                         with {len} bytes"
                    )))
                }
                None if self.released.load(std::sync::atomic::Ordering::Acquire) => return Ok(()),
                None => {
                    return Err(Error::Logic(format!(
                        "{who}: deallocate of {ptr:#x} ({bytes} bytes), which this resource did \
                         not hand out (never, or already freed)"
                    )))
                }
            }
        }
        let freed = free();
        if freed.is_err() {
            self.live.lock().insert(ptr, bytes);
        }
        freed
    }

    /// Takes every live block (to give back elsewhere) and makes later frees of them no-ops.
    pub(crate) fn release_all(&self) -> Vec<(usize, usize)> {
        self.released
            .store(true, std::sync::atomic::Ordering::Release);
        std::mem::take(&mut *self.live.lock()).into_iter().collect()
    }

    /// The number of live blocks.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.live.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Generated blocks against a model (a set of owned bytes): a block is admitted exactly
        /// when none of its bytes is live; a free succeeds exactly for a live block with its
        /// size, and gives its bytes back.
        #[test]
        fn admits_exactly_the_blocks_that_overlap_nothing(
            ops in prop::collection::vec((any::<bool>(), 1usize..64, 0usize..16), 1..200),
        ) {
            let blocks = OutsideBlocks::default();
            let mut model: BTreeMap<usize, usize> = BTreeMap::new();
            for (alloc, start, len) in ops {
                let (ptr, bytes) = (start * 16, len * 16);
                if alloc {
                    let taken = model.iter().any(|(&s, &l)| s < ptr + bytes && ptr < s + l);
                    let got = blocks.admit("test", ptr, bytes);
                    prop_assert_eq!(got.is_ok(), bytes == 0 || !taken);
                    if got.is_ok() && bytes > 0 {
                        model.insert(ptr, bytes);
                    }
                } else {
                    let live = model.get(&ptr) == Some(&bytes) && bytes > 0;
                    let got = blocks.free("test", ptr, bytes, || Ok(()));
                    prop_assert_eq!(got.is_ok(), live || bytes == 0);
                    if live {
                        model.remove(&ptr);
                    }
                }
                prop_assert_eq!(blocks.len(), model.len());
            }
            let released = blocks.release_all();
            prop_assert_eq!(released.len(), model.len());
            for (ptr, bytes) in released {
                prop_assert!(blocks.free("test", ptr, bytes, || Ok(())).is_ok());
            }
        }
    }

    #[test]
    fn a_failed_free_keeps_the_block() {
        let blocks = OutsideBlocks::default();
        blocks.admit("t", 256, 256).unwrap();
        let err = blocks.free("t", 256, 256, || Err(Error::Logic("no".into())));
        assert!(err.is_err());
        assert!(blocks.admit("t", 256, 16).is_err(), "still live");
        blocks.free("t", 256, 256, || Ok(())).unwrap();
    }
}
