//! One stream's part of the stream-ordered core: its list (free blocks and the blocks allocated
//! through it) and its event marks, behind one lock; plus a per-thread cache that finds a stream's list
//! without touching any shared cache line.

#![deny(unsafe_code)]

use super::free_list::{Block, FreeList, ListId};
use super::pool_stats::ListCounters;
use super::stream_events::StreamKey;
use crate::sync::Mutex;

/// Event bookkeeping of a per-thread default stream's list (see the core's "Per-thread default
/// streams").
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct ListMarks {
    /// Memory was freed into the list since its event was last recorded.
    pub unrecorded: bool,
    /// Another thread wanted memory from the list but could not record on its stream.
    pub wanted: bool,
}

/// What one stream's lock guards.
#[derive(Debug)]
pub(super) struct ListState<F> {
    /// The stream's free blocks and the blocks allocated on it.
    pub list: F,
    /// Event state (per-thread default streams only).
    pub marks: ListMarks,
    /// Allocation figures of this list (`memory_stats`).
    pub counters: ListCounters,
    /// Whether the list is in its core's donor set (changed only under this lock, together
    /// with the set).
    pub in_donors: bool,
    pub in_with_free: bool,
}

impl<F: FreeList> ListState<F> {
    /// An empty state.
    pub fn new(sizing: &F::Sizing) -> Self {
        ListState {
            list: F::new(sizing),
            marks: ListMarks::default(),
            counters: ListCounters::default(),
            in_donors: false,
            in_with_free: false,
        }
    }

    /// Takes a free block of `size` bytes from the list as allocated, counted; its address.
    #[inline]
    pub fn take_counted(&mut self, size: usize) -> Option<usize> {
        let p = self.list.take_allocated(size)?;
        self.counters.allocated(size);
        Some(p)
    }

    /// Records `block` (taken elsewhere for this stream) as allocated, counted; its address.
    #[inline]
    pub fn adopt_counted(&mut self, block: Block) -> usize {
        self.list.adopt(block);
        self.counters.allocated(block.size);
        block.addr
    }
}

/// A stream's free list with its lock.
#[derive(Debug)]
pub(super) struct StreamList<F> {
    /// The list's id in its core (1, 2, ...; [`super::free_list::FRESH`] is the fresh list).
    pub id: ListId,
    /// The stream.
    pub key: StreamKey,
    /// The stream's lock and what it guards.
    pub state: Mutex<ListState<F>>,
}

impl<F: FreeList> StreamList<F> {
    /// Records `block` (taken elsewhere for this stream) as allocated; its address.
    pub fn record(&self, block: Block) -> usize {
        self.state.lock().adopt_counted(block)
    }
}

/// The per-thread cache of `(core, stream) -> list`. Core ids are never reused, so an entry of
/// a dropped core can only go stale, never be wrong; the core empties its lists when it drops,
/// so a stale entry holds a small empty list until the slot is reused.
#[cfg(not(feature = "loom"))]
pub(super) mod cache {
    use super::StreamKey;
    use std::any::Any;
    use std::cell::RefCell;
    use std::sync::Arc;

    /// Entries per thread: enough for a binning resource's bins and pool on a few streams.
    const WAYS: usize = 8;

    type Entry = (u64, StreamKey, Arc<dyn Any + Send + Sync>);

    struct Cache {
        entries: [Option<Entry>; WAYS],
        next: usize,
    }

    thread_local! {
        // Why process-wide: a thread finds its stream's list without the core's lock.
        static CACHE: RefCell<Cache> = RefCell::new(Cache {
            entries: std::array::from_fn(|_| None),
            next: 0,
        });
    }

    /// Calls `f` with the cached list of `(core, key)`; `None` on a miss (also when the cache
    /// is in use further up this thread's stack, or being torn down).
    #[inline]
    pub(crate) fn with_cached<L: Any + Send + Sync, R>(
        core: u64,
        key: StreamKey,
        f: &impl Fn(&L) -> R,
    ) -> Option<R> {
        CACHE
            .try_with(|cache| {
                let cache = cache.try_borrow().ok()?;
                let list = cache
                    .entries
                    .iter()
                    .flatten()
                    .find(|(c, k, _)| *c == core && *k == key)?
                    .2
                    .downcast_ref::<L>()?;
                Some(f(list))
            })
            .ok()
            .flatten()
    }

    /// Remembers `list` as the list of `(core, key)` on this thread.
    pub(crate) fn remember(core: u64, key: StreamKey, list: Arc<dyn Any + Send + Sync>) {
        let _ = CACHE.try_with(|cache| {
            if let Ok(mut cache) = cache.try_borrow_mut() {
                let at = cache.next;
                cache.entries[at] = Some((core, key, list));
                cache.next = (at + 1) % WAYS;
            }
        });
    }
}
