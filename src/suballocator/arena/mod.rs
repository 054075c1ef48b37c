//! `ArenaMemoryResource`: a global arena taken from the upstream once, and per-thread and
//! per-stream arenas that take superblocks from it, with RMM's `arena_memory_resource`
//! semantics and no lock shared by all threads on the fast path.
//!
//! # Structure
//! - The **global arena** (`global.rs`) is one range of `arena_size` bytes taken from the
//!   upstream at construction; it never grows. It hands out superblocks (1 MiB, or the whole free
//!   range when less than a further superblock would be left) and serves requests above 1 MiB
//!   directly.
//! - **Arenas** (`local.rs`): one per thread for the per-thread default stream and the legacy
//!   default stream, one per stream for every other stream. Each carves its blocks from its
//!   superblocks (`superblock.rs`), coalescing on free, and knows its live blocks, so bogus,
//!   double and wrongly sized frees are [`Error::Logic`].
//! - Both keep their ranges in a [`RangeHeap`](ranges::RangeHeap) (`ranges.rs`): free ranges in
//!   segregated size classes (good fit, within 1/32 of the smallest class that serves the
//!   request), neighbours linked by address inside a region (the global arena; each superblock),
//!   taken ranges in a hash map by address: O(1) per allocation and free. (RMM picks superblocks
//!   and global ranges by address-ordered first fit, in O(superblocks) and O(ranges).)
//!
//! # Stream ordering
//! A block is reused by a stream only once that stream's later work is ordered after the work of
//! the stream that freed it (RMM's rule: memory is never reused before the freeing stream's work
//! on it is done). CUDA orders some streams implicitly (`ordering::ordered_after`): a stream
//! after itself, both default streams after the legacy default stream, and the legacy default
//! stream after a per-thread default stream (the legacy default stream synchronizes with every
//! blocking stream; per-thread default streams are blocking). A thread's arena serves exactly its
//! two default streams, ordered with each other; a stream's arena serves its stream. So:
//! - a block freed on a stream whose arena owns it is reused at once, with no CUDA call;
//! - a block freed on a stream whose arena does not own it: the freeing stream is synchronized on
//!   the host, then the block goes back to its owner; except a block freed on the legacy default
//!   stream into a thread's arena, whose two streams are ordered after it anyway;
//! - a large block (above 1 MiB) freed on an ordinary stream: that stream is synchronized on the
//!   host, then the range goes back to the global arena (the stream may be destroyed right
//!   after, and CUDA reuses its handle, so nothing may wait on it later);
//! - a large block freed on a default stream (never destroyed) goes back to the global arena
//!   with no CUDA call, and that stream is noted *pending* there (`ordering.rs`). A range handed
//!   out of the global arena (a large block, or a superblock for an arena) is for the allocating
//!   stream, or for the arena's streams; for each pending stream that a user is not implicitly
//!   ordered after, the user waits on an event recorded on the pending stream at hand-out time
//!   ([`StreamEvents::record_after_free`] then [`StreamEvents::make_wait`]: the pending stream
//!   is the legacy one or this thread's own per-thread one), or, for another thread's per-thread
//!   default stream (this thread cannot record on it), every stream is synchronized
//!   ([`StreamEvents::synchronize_all`]), which alone clears the pending streams. A stream stays
//!   pending after an event wait: the range is ordered for its users, not for the next ones.
//!   So a program on the default streams (one thread, or each thread on its own) never makes a
//!   CUDA call in the arena;
//! - on allocation failure, every stream is synchronized ([`StreamEvents::synchronize_all`]) and
//!   empty superblocks go back to the global arena, then the request is retried once. A superblock
//!   freed into after the synchronisation began stays (its work may be pending): each arena counts
//!   its frees and each superblock remembers the count at its latest free. Pending streams whose
//!   latest free came before the synchronisation are cleared.
//!
//! Then out of memory, with RMM's message "... No room in arena.", after writing the arena's state
//! to the dump file when `dump_log_on_failure` is set: `$RMM_ARENA_DUMP` if set, else
//! `rrmm_arena_memory_dump.log` in the current directory (appended to).
//!
//! # Locking
//! Each arena has its own lock; the global arena has its own; the registry of arenas has its own.
//! The stream -> arena lookup is a thread-local cache (the registry is locked only on a miss), so
//! threads on different streams share no lock on the fast path. Lock order: registry, then one
//! arena, then the global arena; no two arenas are locked at once; no CUDA call is made under a
//! lock (a hand-out that needs event waits or a synchronisation makes them after carving its
//! range and unlocking, and gives the range back if they fail). A thread's exit marks its arena
//! orphaned; the next defragmentation returns its idle superblocks and drops it once it holds
//! none.

mod dump;
mod global;
mod local;
mod ordering;
mod ranges;
mod superblock;

pub use dump::{DEFAULT_DUMP_FILE, DUMP_ENV};
pub use superblock::SUPERBLOCK_MIN;

use super::core::{
    current_thread_tag, default_events, next_instance_id, uses_device_streams, ListCounters,
    StreamEvents, StreamKey,
};
use crate::cuda::{self, ContextGuard, Stream};
use crate::error::{Error, Result};
use crate::report::{MemoryStats, Stat};
use crate::resource::{
    align_up, Footprint, MemoryResource, PoolReport, SharedResource, ALLOCATION_ALIGNMENT,
};
use global::GlobalArena;
use local::{Freed, LocalArena};
use ordering::Plan;
use parking_lot::Mutex;
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

/// Which arena: a thread's (per-thread and legacy default streams) or a stream's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ArenaKey {
    /// The arena of the thread with this tag.
    Thread(u64),
    /// The arena of the stream with this handle.
    Stream(usize),
}

impl ArenaKey {
    fn of(stream: Stream) -> ArenaKey {
        if stream.is_default() {
            ArenaKey::Thread(current_thread_tag())
        } else {
            ArenaKey::Stream(stream.raw())
        }
    }
}

/// One arena behind its own lock.
#[derive(Debug)]
struct Arena {
    key: ArenaKey,
    state: Mutex<LocalArena>,
    /// Set when the owning thread exited (per-thread arenas only).
    orphaned: AtomicBool,
}

/// Every arena of one resource, for the slow paths (lookup misses, foreign frees,
/// defragmentation, reports).
#[derive(Debug, Default)]
struct Registry {
    arenas: HashMap<ArenaKey, Arc<Arena>>,
}

/// A suballocator that divides a fixed global arena into per-thread and per-stream arenas (RMM's
/// `arena_memory_resource`); see the module docs for the design.
///
/// Cheap to clone (clones share the arenas); the global arena goes back to the upstream when
/// the last clone drops.
#[derive(Clone, Debug)]
pub struct ArenaMemoryResource {
    inner: Arc<Inner>,
}

struct Inner {
    id: u64,
    upstream: SharedResource,
    base: usize,
    size: usize,
    global: Mutex<GlobalArena>,
    registry: Mutex<Registry>,
    events: Arc<dyn StreamEvents>,
    /// Whether streams are real (synchronized through CUDA before memory crosses streams).
    device_streams: bool,
    dump_path: Option<PathBuf>,
    /// The link to the memory below (the upstream's): nothing is handed out while a pool below
    /// sleeps (the arena's memory is one block of such a pool), and the arena is a tenant of
    /// those pools (its free ranges are not copied by a sleep).
    link: crate::resource::Link,
    /// The figures of arenas dropped since (an orphaned arena's, kept in the totals).
    retired: Mutex<ListCounters>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArenaMemoryResource")
            .field("upstream", &self.upstream)
            .field("base", &format_args!("{:#x}", self.base))
            .field("size", &self.size)
            .field("dump_path", &self.dump_path)
            .finish_non_exhaustive()
    }
}

impl Drop for Inner {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // Nothing to report to from a drop; the upstream keeps working either way.
        // The free is on the legacy default stream, ordered after the pending frees (all on
        // default streams).
        // SAFETY: the global arena was allocated from this upstream with this size in
        // `with_events` and is freed once, here; the last handle is gone, so no block of it is
        // handed out any more.
        let _ = unsafe {
            self.upstream
                .deallocate(self.base, self.size, Stream::DEFAULT)
        };
    }
}

/// RMM's check of an arena's size, `given` (`None`: half the free memory, `size` bytes) or
/// `size` once rounded down to 256: at least one superblock. For the arena and for a stack's
/// plan before anything is built. RMM's words start the message; the value and the fix follow.
///
/// # Errors
/// [`Error::Logic`] (RMM's `logic_error`) naming `arena_size` and the value.
pub fn check_arena_size(given: Option<usize>, size: usize) -> Result<()> {
    if size >= SUPERBLOCK_MIN {
        return Ok(());
    }
    let given = given.map_or_else(
        || format!("{size} bytes, half the free memory"),
        |s| s.to_string(),
    );
    Err(Error::Logic(format!(
        "Arena size smaller than minimum superblock size. (arena_size={given}: give at least \
         {SUPERBLOCK_MIN} bytes, 1 MiB)"
    )))
}

impl ArenaMemoryResource {
    /// An arena over `upstream` of `arena_size` bytes (rounded down to 256; default: half the
    /// upstream's free memory from [`MemoryResource::memory_info`]), taken from the upstream now.
    /// With `dump_log_on_failure`, out-of-memory appends the arena's state to
    /// `$RMM_ARENA_DUMP`, or `rrmm_arena_memory_dump.log` in the current directory.
    ///
    /// # Errors
    /// [`Error::Logic`] when the size is below a superblock (1 MiB);
    /// [`Error::InvalidArgument`] when no size is given and the upstream does not report its
    /// free memory; the upstream's error when it cannot supply the arena.
    pub fn new(
        upstream: SharedResource,
        arena_size: Option<usize>,
        dump_log_on_failure: bool,
    ) -> Result<Self> {
        let events = default_events(&upstream);
        let dump = dump_log_on_failure.then(|| {
            std::env::var_os(DUMP_ENV)
                .filter(|p| !p.is_empty())
                .map_or_else(|| PathBuf::from(DEFAULT_DUMP_FILE), PathBuf::from)
        });
        Self::with_events(upstream, arena_size, dump, events)
    }

    /// As [`ArenaMemoryResource::new`], with the dump file given (`None`: no dump) and an
    /// explicit cross-stream synchronisation (tests use a recording fake).
    ///
    /// # Errors
    /// As [`ArenaMemoryResource::new`].
    pub fn with_events(
        upstream: SharedResource,
        arena_size: Option<usize>,
        dump_path: Option<PathBuf>,
        events: Arc<dyn StreamEvents>,
    ) -> Result<Self> {
        let size = match arena_size {
            Some(size) => size,
            None => {
                let (free, _) = upstream.memory_info().ok_or_else(|| {
                    Error::invalid(
                        "arena_size",
                        "the upstream does not report its free memory; give arena_size",
                    )
                })?;
                free / 2
            }
        } & !(ALLOCATION_ALIGNMENT - 1);
        check_arena_size(arena_size, size)?;
        let base = upstream.allocate(size, Stream::DEFAULT)?;
        let device_streams = uses_device_streams(upstream.kind());
        // The arena answers from its bookkeeping and calls the upstream to grow, under its locks.
        let link = upstream.link().suballocated();
        let inner = Arc::new(Inner {
            id: next_instance_id(),
            link,
            upstream,
            base,
            size,
            global: Mutex::new(GlobalArena::new(base, size)),
            registry: Mutex::new(Registry::default()),
            retired: Mutex::new(ListCounters::default()),
            events,
            device_streams,
            dump_path,
        });
        // A tenant of every pool below whose memory moves, now and as the graph below grows.
        let weak: std::sync::Weak<dyn crate::resource::sleep::Tenant> = Arc::downgrade(&inner) as _;
        inner.link.admit(&weak);
        Ok(ArenaMemoryResource { inner })
    }

    /// The global arena's size: the bytes held from the upstream.
    pub fn arena_size(&self) -> usize {
        self.inner.size
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &SharedResource {
        &self.inner.upstream
    }

    /// Where out-of-memory dumps go (`None` without `dump_log_on_failure`).
    pub fn dump_path(&self) -> Option<&Path> {
        self.inner.dump_path.as_deref()
    }

    /// Free bytes in the global arena (not counting free space inside the arenas' superblocks).
    pub fn global_free_bytes(&self) -> usize {
        self.inner.global.lock().free_bytes()
    }

    /// Free bytes anywhere: the global arena's plus the arenas' superblocks'.
    pub fn free_bytes(&self) -> usize {
        self.footprint_now().free_bytes
    }

    /// Number of arenas (per-thread and per-stream) that exist now.
    pub fn arena_count(&self) -> usize {
        self.inner.registry.lock().arenas.len()
    }

    /// Synchronizes every stream and returns every empty superblock of every arena to the global
    /// arena (what an allocation does before it fails); drops arenas of exited threads that hold
    /// nothing.
    ///
    /// # Errors
    /// CUDA errors from the synchronisation.
    ///
    /// # Time Complexity
    /// O(superblocks) plus the synchronisation.
    pub fn defragment(&self) -> Result<()> {
        let arenas = self.snapshot();
        let seqs: Vec<u64> = arenas.iter().map(|a| a.state.lock().seq()).collect();
        let stamp = self.inner.global.lock().pending.stamp();
        self.inner.events.synchronize_all()?;
        let mut idle = Vec::new();
        for (arena, seq) in arenas.iter().zip(seqs) {
            idle.extend(arena.state.lock().take_idle(seq));
        }
        {
            let mut global = self.inner.global.lock();
            for (start, size) in idle {
                global.release(start, size);
            }
            global.pending.clear_through(stamp);
        }
        let mut retired = self.inner.retired.lock();
        self.inner.registry.lock().arenas.retain(|_, a| {
            let state = a.state.lock();
            let gone = a.orphaned.load(Ordering::Acquire) && state.is_bare();
            if gone {
                // Its figures stay in the totals.
                retired.absorb(&state.counters);
            }
            !gone
        });
        Ok(())
    }

    /// The global arena's free ranges and every arena's superblocks, as the dump writes them.
    pub fn state_report(&self) -> String {
        self.describe(None)
    }

    fn describe(&self, requested: Option<usize>) -> String {
        let arenas = self.snapshot();
        let guards: Vec<_> = arenas.iter().map(|a| (a.key, a.state.lock())).collect();
        let views: Vec<(ArenaKey, &LocalArena)> = guards.iter().map(|(k, g)| (*k, &**g)).collect();
        let global = self.inner.global.lock();
        dump::report(requested, &global, &views)
    }

    /// The free of `deallocate`, checked (see there).
    fn free_block(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        let rounded = align_up(bytes, ALLOCATION_ALIGNMENT)
            .filter(|&r| r > 0)
            .ok_or_else(|| Self::unknown(ptr, bytes))?;
        if rounded > SUPERBLOCK_MIN {
            // A default stream is never destroyed: it is noted pending instead (module docs).
            if !stream.is_default() {
                self.sync_stream(stream)?;
            }
            let mut global = self.inner.global.lock();
            return match global.deallocate_large(ptr, rounded) {
                Freed::Done => {
                    if stream.is_default() {
                        global.pending.note(StreamKey::of(stream));
                    }
                    Ok(())
                }
                Freed::WrongSize(size) => Err(Self::wrong_size(ptr, bytes, size)),
                Freed::NotHere => Err(Self::unknown(ptr, bytes)),
            };
        }
        let own = self.arena_for(stream);
        match own.state.lock().deallocate(ptr, rounded) {
            Freed::Done => return Ok(()),
            Freed::WrongSize(size) => return Err(Self::wrong_size(ptr, bytes, size)),
            Freed::NotHere => {}
        }
        let owner = self.snapshot().into_iter().find_map(|a| {
            let size = (!Arc::ptr_eq(&a, &own))
                .then(|| a.state.lock().live_size(ptr))
                .flatten()?;
            Some((a, size))
        });
        let owner = match owner {
            Some((owner, size)) if size == rounded => owner,
            Some((_, size)) => return Err(Self::wrong_size(ptr, bytes, size)),
            None => {
                return Err(match self.inner.global.lock().large_size(ptr) {
                    Some(size) => Self::wrong_size(ptr, bytes, size),
                    None => Self::unknown(ptr, bytes),
                })
            }
        };
        // Another arena's block: the freeing stream catches up before the owner may reuse it,
        // unless both of the owner's streams are ordered after it (the legacy default stream
        // into a thread's arena).
        if !(stream.is_legacy_default() && matches!(owner.key, ArenaKey::Thread(_))) {
            self.sync_stream(stream)?;
        }
        let freed = owner.state.lock().deallocate(ptr, rounded);
        match freed {
            Freed::Done => Ok(()),
            Freed::WrongSize(size) => Err(Self::wrong_size(ptr, bytes, size)),
            Freed::NotHere => Err(Self::unknown(ptr, bytes)),
        }
    }

    /// Every arena, in a stable order (threads, then streams, by key).
    fn snapshot(&self) -> Vec<Arc<Arena>> {
        let mut arenas: Vec<Arc<Arena>> = self
            .inner
            .registry
            .lock()
            .arenas
            .values()
            .cloned()
            .collect();
        arenas.sort_by_key(|a| match a.key {
            ArenaKey::Thread(t) => (0, t as usize),
            ArenaKey::Stream(h) => (1, h),
        });
        arenas
    }

    /// The arena for `stream` on the calling thread: from the thread-local cache, else from the
    /// registry (created there on first use).
    fn arena_for(&self, stream: Stream) -> Arc<Arena> {
        let key = ArenaKey::of(stream);
        let id = self.inner.id;
        if let Some(arena) = cache::lookup(id, key) {
            return arena;
        }
        let arena = {
            let mut registry = self.inner.registry.lock();
            registry
                .arenas
                .entry(key)
                .or_insert_with(|| {
                    Arc::new(Arena {
                        key,
                        state: Mutex::new(LocalArena::default()),
                        orphaned: AtomicBool::new(false),
                    })
                })
                .clone()
        };
        cache::insert(id, key, &arena);
        arena
    }

    /// One attempt at an allocation of `rounded` bytes, with no synchronisation but what orders
    /// a range from the global arena after its pending frees (see the module docs).
    fn try_allocate(&self, rounded: usize, stream: Stream) -> Result<Option<usize>> {
        if rounded > SUPERBLOCK_MIN {
            let (ptr, plan) = {
                let mut global = self.inner.global.lock();
                let Some(ptr) = global.allocate_large(rounded) else {
                    return Ok(None);
                };
                (ptr, global.pending.plan(&[StreamKey::of(stream)]))
            };
            if let Err(e) = self.order_after_pending(plan) {
                self.inner.global.lock().deallocate_large(ptr, rounded);
                return Err(e);
            }
            return Ok(Some(ptr));
        }
        let arena = self.arena_for(stream);
        let mut local = arena.state.lock();
        if let Some(ptr) = local.allocate(rounded) {
            return Ok(Some(ptr));
        }
        let thread_streams = [
            StreamKey::of(Stream::DEFAULT),
            StreamKey::of(Stream::PER_THREAD),
        ];
        let own_stream = [StreamKey::of(stream)];
        let users: &[StreamKey] = match arena.key {
            ArenaKey::Thread(_) => &thread_streams,
            ArenaKey::Stream(_) => &own_stream,
        };
        let (start, size, plan) = {
            let mut global = self.inner.global.lock();
            let Some((start, size)) = global.acquire(rounded) else {
                return Ok(None);
            };
            (start, size, global.pending.plan(users))
        };
        if plan.is_empty() {
            return Ok(local.adopt_and_allocate(start, size, rounded));
        }
        drop(local);
        if let Err(e) = self.order_after_pending(plan) {
            self.inner.global.lock().release(start, size);
            return Err(e);
        }
        let ptr = arena.state.lock().adopt_and_allocate(start, size, rounded);
        Ok(ptr)
    }

    /// Carries out `plan`: event waits, or a host synchronisation of every stream (which clears
    /// the streams pending when the plan was made). Called with no lock held.
    fn order_after_pending(&self, plan: Plan) -> Result<()> {
        if plan.is_empty() {
            return Ok(());
        }
        let events = &self.inner.events;
        if plan.synchronize_all {
            events.synchronize_all()?;
            self.inner.global.lock().pending.clear_through(plan.stamp);
            return Ok(());
        }
        let mut recorded = None;
        for (pending, user) in plan.waits {
            if recorded != Some(pending) {
                events.record_after_free(pending)?;
                recorded = Some(pending);
            }
            events.make_wait(user, pending)?;
        }
        Ok(())
    }

    /// Waits on the host for `stream` (before its memory crosses to other streams).
    fn sync_stream(&self, stream: Stream) -> Result<()> {
        if !self.inner.device_streams {
            return Ok(());
        }
        let device = match self.inner.upstream.device() {
            Some(d) => d,
            None => cuda::current_device()?,
        };
        let _ctx = ContextGuard::new(device)?;
        stream.synchronize()
    }

    fn no_room(bytes: usize) -> Error {
        Error::OutOfMemory {
            requested: bytes,
            message: format!(
                "std::bad_alloc: out_of_memory: Maximum pool size exceeded (failed to allocate \
                 {bytes} bytes): No room in arena."
            ),
        }
    }

    fn wrong_size(ptr: usize, bytes: usize, size: usize) -> Error {
        Error::Logic(format!(
            "arena: deallocation of {ptr:#x} with {bytes} bytes, but it was allocated with {size} \
             bytes (rounded)"
        ))
    }

    fn unknown(ptr: usize, bytes: usize) -> Error {
        Error::Logic(format!(
            "arena: allocation not found: {ptr:#x} ({bytes} bytes) is not a live allocation of \
             this resource (foreign pointer or double free)"
        ))
    }

    fn dump(&self, bytes: usize) {
        if let Some(path) = &self.inner.dump_path {
            let text = self.describe(Some(bytes));
            // The out-of-memory error is what the caller needs; a dump that cannot be written is
            // not worth replacing it.
            let _ = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()));
        }
    }

    /// Held, free, largest free block and free blocks. A superblock of a thread's arena that is
    /// wholly free joins the global arena's free ranges it touches (a request that needs both
    /// gets them once the defragmentation of a failing request returns the superblock), so an
    /// arena with nothing live reports one free block, not one per superblock.
    fn footprint_now(&self) -> Footprint {
        let mut fp = Footprint {
            held_bytes: self.inner.size,
            ..Footprint::default()
        };
        let mut joinable: Vec<(usize, usize)> = Vec::new();
        for arena in self.snapshot() {
            let local = arena.state.lock();
            for sb in local.superblocks() {
                if sb.free_bytes == sb.size {
                    joinable.push((sb.start, sb.size));
                } else {
                    fp.free_bytes += sb.free_bytes;
                    fp.largest_free_block = fp.largest_free_block.max(sb.largest_free);
                    fp.free_blocks += sb.free_blocks;
                }
            }
        }
        joinable.extend(self.inner.global.lock().free_ranges());
        joinable.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(joinable.len());
        for (start, size) in joinable {
            match merged.last_mut() {
                Some(last) if last.0 + last.1 == start => last.1 += size,
                _ => merged.push((start, size)),
            }
        }
        for (_, size) in merged {
            fp.free_bytes += size;
            fp.largest_free_block = fp.largest_free_block.max(size);
            fp.free_blocks += 1;
        }
        fp
    }
}

/// The arena as a tenant of the pools below that can sleep: one segment (the global arena) whose
/// blocks are the live blocks (small and large) and the free ranges (global and in superblocks).
impl crate::resource::sleep::Tenant for Inner {
    fn segments(&self) -> Vec<crate::report::SegmentInfo> {
        use crate::report::snapshot::{BlockInfo, BlockState};
        let mut blocks: Vec<(usize, usize, BlockState)> = Vec::new();
        let arenas: Vec<Arc<Arena>> = self.registry.lock().arenas.values().cloned().collect();
        for arena in arenas {
            let (live, free) = arena.state.lock().blocks();
            blocks.extend(live.into_iter().map(|(a, n)| (a, n, BlockState::Allocated)));
            blocks.extend(free.into_iter().map(|(a, n)| (a, n, BlockState::Free)));
        }
        {
            let global = self.global.lock();
            blocks.extend(
                global
                    .large_ranges()
                    .into_iter()
                    .map(|(a, n)| (a, n, BlockState::Allocated)),
            );
            blocks.extend(
                global
                    .free_ranges()
                    .into_iter()
                    .map(|(a, n)| (a, n, BlockState::Free)),
            );
        }
        blocks.sort_unstable_by_key(|&(a, _, _)| a);
        vec![crate::report::SegmentInfo {
            address: self.base,
            total_size: self.size,
            expandable: false,
            tier: None,
            offloaded: self.link.asleep(),
            blocks: blocks
                .into_iter()
                .map(|(address, size, state)| BlockInfo {
                    address,
                    size,
                    requested_size: if state == BlockState::Allocated {
                        size
                    } else {
                        0
                    },
                    state,
                })
                .collect(),
        }]
    }
}

/// PyTorch's figures of the arena: its allocations summed over its arenas (each counts under
/// its own lock: a peak is the sum of their peaks) and the global arena's large blocks; one
/// segment, the global arena (offloaded while a pool below sleeps); its snapshot is that
/// segment with its live blocks and free ranges.
impl PoolReport for ArenaMemoryResource {
    fn footprint(&self) -> Footprint {
        self.footprint_now()
    }

    fn held_bytes(&self) -> usize {
        self.inner.size
    }

    fn memory_stats(&self) -> Option<MemoryStats> {
        let size = self.inner.size as u64;
        let asleep = self.inner.link.asleep();
        let mut stats = MemoryStats {
            segment: Stat {
                current: 1,
                peak: 1,
                allocated: 1,
                freed: 0,
            },
            reserved_bytes: Stat {
                current: if asleep { 0 } else { size },
                peak: size,
                allocated: size,
                freed: 0,
            },
            num_device_alloc: 1,
            offloaded_bytes: if asleep { size } else { 0 },
            ..MemoryStats::default()
        };
        self.inner.retired.lock().add_to(&mut stats);
        self.inner.global.lock().counters.add_to(&mut stats);
        for arena in self.arenas() {
            arena.state.lock().counters.add_to(&mut stats);
        }
        Some(stats)
    }

    fn reset_peak_memory_stats(&self) -> bool {
        self.inner.retired.lock().reset_peaks();
        self.inner.global.lock().counters.reset_peaks();
        for arena in self.arenas() {
            arena.state.lock().counters.reset_peaks();
        }
        true
    }

    fn memory_snapshot(&self) -> Option<Vec<crate::report::SegmentInfo>> {
        use crate::resource::sleep::Tenant;
        Some(self.inner.segments())
    }
}

impl ArenaMemoryResource {
    /// Every arena now (the registry held only to copy the list).
    fn arenas(&self) -> Vec<Arc<Arena>> {
        self.inner
            .registry
            .lock()
            .arenas
            .values()
            .cloned()
            .collect()
    }
}

impl MemoryResource for ArenaMemoryResource {
    // One `unsafe` call: the free of a block handed out a moment ago, to no one.
    #[allow(unsafe_code)]
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        if bytes == 0 {
            return Ok(0);
        }
        let rounded = align_up(bytes, ALLOCATION_ALIGNMENT).ok_or_else(|| Self::no_room(bytes))?;
        for _ in 0..8 {
            // One process-wide load while nothing moves; a pool below asleep for the ledger
            // wakes, one asleep for its user refuses.
            self.inner.link.sleep.check("arena", bytes)?;
            let mut ptr = self.try_allocate(rounded, stream)?;
            if ptr.is_none() {
                self.defragment()?;
                ptr = self.try_allocate(rounded, stream)?;
            }
            let Some(ptr) = ptr else {
                self.dump(rounded);
                return Err(Self::no_room(rounded));
            };
            if !self.inner.link.asleep() {
                return Ok(ptr);
            }
            // A sleep below began meanwhile (see the stream-ordered core): the block goes back,
            // and the allocation is made again once a sleep for the ledger woke.
            // SAFETY: `ptr` was handed out just now with `bytes`, to no one.
            unsafe { self.deallocate(ptr, bytes, stream) }?;
        }
        Err(crate::resource::sleep::asleep_below_error("arena", bytes))
    }

    // The trait's method is unsafe; the free checks the pointer and size against the live
    // blocks it handed out, so a bogus, double or missized free is a logic error, not harm.
    #[allow(unsafe_code)]
    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        self.free_block(ptr, bytes, stream)?;
        // A tag of the block (in a pool below that can sleep) goes with it (one load while no
        // block of the process is tagged).
        self.inner.link.sleep.forget(ptr);
        Ok(())
    }

    crate::resource::memory_from!(|this| this.inner.upstream);

    /// Free: every free byte in the arena; total: the arena's size.
    fn memory_info(&self) -> Option<(usize, usize)> {
        Some((self.free_bytes(), self.inner.size))
    }

    fn identity(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    fn report(&self) -> Option<&dyn PoolReport> {
        Some(self)
    }

    fn upstreams(&self) -> Vec<SharedResource> {
        vec![self.inner.upstream.clone()]
    }

    fn link(&self) -> crate::resource::Link {
        self.inner.link.clone()
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn name(&self) -> &'static str {
        "arena"
    }
}

/// The thread-local stream -> arena cache.
mod cache {
    use super::{Arc, Arena, ArenaKey, Ordering, RefCell, Weak};

    /// Stream arenas cached per thread; the oldest is dropped beyond this.
    const STREAM_SLOTS: usize = 16;

    struct Slot {
        resource: u64,
        key: ArenaKey,
        arena: Weak<Arena>,
    }

    impl Drop for Slot {
        fn drop(&mut self) {
            // The thread's own arena loses its thread: mark it for the next defragmentation.
            if matches!(self.key, ArenaKey::Thread(_)) {
                if let Some(arena) = self.arena.upgrade() {
                    arena.orphaned.store(true, Ordering::Release);
                }
            }
        }
    }

    #[derive(Default)]
    struct Cache {
        /// This thread's arenas, one per live resource; kept until the thread or the resource
        /// ends.
        threads: Vec<Slot>,
        /// Recently used stream arenas.
        streams: Vec<Slot>,
    }

    thread_local! {
        // Why process-wide: RMM's per-thread arenas: each thread's own, keyed by resource.
        static CACHE: RefCell<Cache> = RefCell::new(Cache::default());
    }

    /// The cached arena of `key` for resource `resource`, if any.
    pub(super) fn lookup(resource: u64, key: ArenaKey) -> Option<Arc<Arena>> {
        CACHE
            .try_with(|c| {
                let c = c.try_borrow().ok()?;
                let slots = match key {
                    ArenaKey::Thread(_) => &c.threads,
                    ArenaKey::Stream(_) => &c.streams,
                };
                slots
                    .iter()
                    .find(|s| s.resource == resource && s.key == key)
                    .and_then(|s| s.arena.upgrade())
            })
            .ok()
            .flatten()
    }

    /// Caches `arena` as the arena of `key` for `resource`, dropping slots of dead resources.
    pub(super) fn insert(resource: u64, key: ArenaKey, arena: &Arc<Arena>) {
        let _ = CACHE.try_with(|c| {
            let Ok(mut c) = c.try_borrow_mut() else {
                return;
            };
            let slots = match key {
                ArenaKey::Thread(_) => &mut c.threads,
                ArenaKey::Stream(_) => &mut c.streams,
            };
            let present = |s: &Slot| s.resource == resource && s.key == key;
            if slots
                .iter()
                .any(|s| present(s) && s.arena.strong_count() > 0)
            {
                return;
            }
            slots.retain(|s| s.arena.strong_count() > 0 && !present(s));
            if matches!(key, ArenaKey::Stream(_)) && slots.len() >= STREAM_SLOTS {
                slots.remove(0);
            }
            slots.push(Slot {
                resource,
                key,
                arena: Arc::downgrade(arena),
            });
        });
    }
}

// Tests call the unsafe `deallocate` and make fake stream handles, each with its SAFETY line.
#[cfg(test)]
#[allow(unsafe_code)]
mod tests;
