//! The one stream-ordered core that the pool and the fixed-size resource plug their strategy
//! into (RMM's `stream_ordered_memory_resource`): a [`FreeList`] type (how blocks are carved and
//! put back) and a [`Growth`] policy (how the core grows from its upstream and gives back).
//!
//! # Ordering rules
//! - Each stream ([`StreamKey`]) has its own free list. Memory freed on stream A goes to A's list
//!   and is reused by later allocations on A at once, with no CUDA call on that path.
//! - Memory fresh from the upstream sits in the fresh list: it belongs to no stream and any
//!   stream takes it without a wait. A block freed on A coalesces at once with free neighbours in
//!   A's list only. Fresh memory stays fresh when a neighbour is freed (were it absorbed, the
//!   first free beside the fresh tail would hand all fresh memory to one stream, and every other
//!   stream would then wait on that stream's work: cold-start serialization). Only when A's
//!   allocation finds no fit anywhere, before growing, do the fresh blocks that border A's free
//!   blocks move into A's list, coalesced (the sound direction: fresh memory may become A's,
//!   never the reverse).
//! - An allocation on B that neither B's list nor the fresh list can serve takes a block from
//!   another stream A's list only after [`StreamEvents::make_wait`]`(B, A)`: an event recorded on
//!   A (after every free into A's list) and waited on by B. One event per owner stream, reused.
//!   A's lock is held from the record to the take, so no block freed after the record is taken.
//! - When nothing fits, the core grows from the upstream (into the fresh list). When growth
//!   fails, the core takes every stream's free blocks out of their lists, synchronizes every
//!   stream ([`StreamEvents::synchronize_all`]: it covers every free of the blocks taken out,
//!   as those came before it), puts them in the fresh list (coalescing across streams), retries,
//!   then gives back the fully free chunks it grew (never the initial chunk: a failed request
//!   does not shrink the pool below what it was built with) and grows again, before reporting
//!   out of memory. A failure that finds nothing freed (no list's free count moved), grown or
//!   released since a last resort ran skips the steps of it that ran then: no list holds a free
//!   block, and once grown chunks were given back none is fully free, so they would change
//!   nothing (the upstream is still asked). With no free block in any list, the merge does not
//!   synchronize: every block in the fresh list is unused since its last synchronization.
//!   `release()` gives back every fully free chunk, the initial one included.
//!
//! # Recording events lazily (every stream, per-thread default streams included)
//! A stealer never records an event on another stream: another thread cannot record on a
//! thread's per-thread default stream (PTDS), and any other stream may have been destroyed after
//! its frees (RMM records at every free, so it never touches a stream later; rrmm records only
//! when memory must cross streams). So a free only marks its list "unrecorded", with no CUDA
//! call. A thread that would take memory from another stream's list takes it only when the
//! list's event was recorded after its latest free (then it waits on that event); otherwise it
//! marks the list "wanted" and looks elsewhere (fresh memory, growth, and in the end the
//! synchronize-and-merge path, a context synchronization that covers destroyed streams too). The
//! next allocation on that stream (or, for a per-thread default stream, also the next free on
//! its thread) records the event when the list is both unrecorded and wanted (under its lock).
//! A free on any other stream never makes a CUDA call: frameworks free memory after its stream
//! was destroyed (a CuPy array outliving its stream), and the handle is then only a key.
//!
//! # Fresh chunks
//! Chunks from the upstream are assumed usable by every stream at once. This holds for the
//! synchronous upstreams (cuda, managed, pinned, simulated); over a stream-ordered upstream
//! (cuda_async) the chunk is allocated on the requesting stream.
//!
//! # Locking
//! No lock is global on the same-stream path. Each stream's list ([`StreamList`]) has its own
//! mutex, guarding its free blocks, the blocks allocated on that stream (by address, so a free
//! finds its block, and a bogus or double free or one with another size is a logic error) and its
//! event marks. A thread finds its stream's list through a per-thread cache of `(core, stream) ->
//! list` (no shared cache line touched); on a miss, through the directory (a read-write lock over
//! the map of lists). An allocation that its own list serves, and a free on the stream that
//! allocated the block, take that one mutex and nothing else, and make no CUDA call (except the
//! owner's record of a wanted PTDS list, above).
//!
//! The shared part (fresh list, upstream chunks, pool size, growth, steals, the
//! synchronize-and-merge, release) is behind the `shared` mutex, taken only when a stream's own
//! list cannot serve. A free of a block allocated on another stream finds the block by locking
//! the other lists one at a time (through the directory), then puts it in its own list.
//!
//! Lock order (a thread holding a lock takes only locks further down; it may also *try* one
//! further up, which never waits: a stream whose list cannot serve tries `shared` while holding
//! its list's lock, to take fresh memory in one go):
//! 1. `shared`;
//! 2. `directory` (read for iteration; write only when adding a list, holding nothing else);
//! 3. one stream list's mutex (never two at once);
//! 4. `donors` (the lists that may hold free blocks a steal can take; held for an insert, a
//!    removal or a copy, never while taking another lock);
//! 5. the [`StreamEvents`] implementation's own lock, and the upstream's.
//!
//! Steals visit only the donor lists, so the cost of a miss does not grow with the streams that
//! ever existed: a list joins the donors with its first free (or when its stream records after
//! frees) and leaves them when a steal finds it empty or with frees its stream has not recorded
//! (its stream records at its next allocation, which brings it back).
//!
//! CUDA calls under a lock: growth and give-back (upstream) under `shared`; the event record and
//! wait of a steal under `shared` and the owner list's mutex (so no free slips in between);
//! `synchronize_all` under `shared` only. `release()` gives the chunks back after unlocking.
//! `tests/loom_core.rs` model-checks this protocol with loom (the `loom` feature, see `crate::sync`).
//!
//! # Extension points
//! See `growth.rs`: a strategy grows by returning a chunk with a region (chunks of one region
//! coalesce, so one virtual range grown at its end stays one block), gives chunks back its way,
//! and may trim free memory inside free blocks on `release()`.

#![deny(unsafe_code)]

use super::free_list::{AddressMap, Block, Found, FreeList, ListId, FRESH};
use super::growth::{GrowRequest, Growth};
use super::pool_stats::PoolCounters;
use super::stream_events::{StreamEvents, StreamKey};
use super::stream_list::{ListMarks, ListState, StreamList};
use crate::cuda::Stream;
use crate::error::{Error, Result};
use crate::report::snapshot::{assemble, BlockState, SegmentInfo};
use crate::report::{MemoryStats, PoolReport, StreamFree};
use crate::resource::{Footprint, Link, MemoryKind, MemoryResource, SharedResource};
use crate::sync::{Mutex, OwnedGuard, OwnedMutex, RwLock};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// The generic stream-ordered suballocator: free lists of type `F`, a growth policy (which
/// owns the source of memory), and stream events.
pub(crate) struct StreamOrderedCore<F: FreeList> {
    /// Unique for the process's lifetime (the per-thread list cache's key; no cache under loom).
    #[cfg_attr(feature = "loom", allow(dead_code))]
    id: u64,
    events: Arc<dyn StreamEvents>,
    growth: Box<dyn Growth>,
    sizing: F::Sizing,
    name: &'static str,
    /// The fresh list, the chunks and every stream's list: shared (`Arc`) with the core's tenant
    /// record in the pools below that can sleep, which reads them through a `Weak`.
    state: Arc<CoreState<F>>,
    /// The ids of the lists a steal looks at (see the lock order).
    donors: Mutex<std::collections::BTreeSet<ListId>>,
    /// The ids of the lists that may hold free blocks (a superset: a list joins at a free into
    /// it and leaves when a walk of the figures finds it empty), so the figures walk these and
    /// not every stream that ever existed (see the lock order: as `donors`).
    with_free: Mutex<std::collections::BTreeSet<ListId>>,
    /// Where the last steal stopped in `donors` (a hint: any value is safe).
    steal_cursor: AtomicU32,
    /// Growth, release and failure figures (`memory_stats`; the lists count allocations).
    counters: PoolCounters,
    /// The free bytes last read ([`Self::free_bytes_now_or_last`]).
    last_free: AtomicUsize,
    /// The link to the memory below (the growth policy's upstream's, made once at
    /// construction; its pools are a live cell that grows with the graph below): nothing is
    /// handed out while a pool below sleeps, a free forgets a tag, and snapshots mark the
    /// segments offloaded then (see `crate::resource::sleep`); blocks of managed memory placed
    /// by blocks are placed as they are handed out.
    link: Link,
    /// Whether the link places blocks (managed memory below): the path's one fixed branch.
    /// Sleep costs the path one process-wide load while nothing in the process moves
    /// ([`any_moving`](crate::resource::sleep::any_moving)).
    linked: bool,
}

impl<F: FreeList> std::fmt::Debug for StreamOrderedCore<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamOrderedCore")
            .field("name", &self.name)
            .field("source", &self.growth.source_name())
            .field("growth", &self.growth)
            .field("sizing", &self.sizing)
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

/// One allocation request on its way through the core.
#[derive(Clone, Copy, Debug)]
struct Request {
    /// The user's request, in bytes.
    bytes: usize,
    /// The block size it needs ([`FreeList::block_size_for`]).
    size: usize,
    /// The stream it is for.
    stream: Stream,
}

/// A chunk held from the upstream.
#[derive(Clone, Copy, Debug)]
struct Chunk {
    block: Block,
    /// Taken at construction: kept when a failed request gives grown chunks back.
    initial: bool,
}

/// The blocks of a core: what a snapshot reads.
struct CoreState<F> {
    /// Held while growing from (and giving back to) the source: an upstream that calls back
    /// into this core on the same thread gets an error, not a deadlock.
    shared: OwnedMutex<Shared<F>>,
    directory: RwLock<Directory<F>>,
}

impl<F: FreeList> CoreState<F> {
    /// Calls `f` with a consistent view of the free lists: the shared state with the fresh list
    /// (`None` from inside this core's own upstream call, see `busy_here`) and every
    /// stream's list. No
    /// block moves between lists meanwhile: the shared lock stops moves from and to the fresh
    /// list and steals, the directory's write lock stops frees across streams; a stream's own
    /// allocations and frees change only its list, which `f` locks one at a time.
    fn with_all_lists<T>(
        &self,
        f: impl FnOnce(Option<&Shared<F>>, &[Arc<StreamList<F>>]) -> T,
    ) -> T {
        let sh = self.shared.lock().ok();
        let dir = self.directory.write();
        f(sh.as_deref(), &dir.all)
    }

    /// As [`Self::with_all_lists`] if the shared state and the directory can be taken at once;
    /// `None` while another thread (or this one) holds either.
    fn try_with_all_lists<T>(
        &self,
        f: impl FnOnce(&Shared<F>, &[Arc<StreamList<F>>]) -> T,
    ) -> Option<T> {
        let sh = self.shared.try_lock()?;
        let dir = self.directory.try_write()?;
        Some(f(&sh, &dir.all))
    }

    /// Every segment with its blocks: `segments` where the growth policy keeps its own (the
    /// expandable pool's runs of mapped pages), else the chunks; empty from inside the core's
    /// own upstream call.
    fn snapshot(&self, segments: Option<Vec<(usize, usize)>>) -> Vec<SegmentInfo> {
        // One consistent view (no block moves between lists while it is read), or blocks seen
        // in two lists would overlap in their segment.
        let view = self.with_all_lists(|sh, lists| {
            let sh = sh?;
            let expandable = segments.is_some();
            let segments = segments.unwrap_or_else(|| {
                sh.chunks
                    .values()
                    .map(|c| (c.block.addr, c.block.size))
                    .collect()
            });
            let mut free: Vec<Block> = sh.fresh.free_ranges();
            let mut allocated = Vec::new();
            for list in lists {
                let st = list.state.lock();
                free.extend(st.list.free_ranges());
                allocated.extend(
                    st.list
                        .allocated_blocks()
                        .iter()
                        .map(|b| (b.addr, b.size, b.size)),
                );
            }
            Some((segments, allocated, free, expandable))
        });
        let Some((segments, allocated, free, expandable)) = view else {
            return Vec::new();
        };
        let free = if F::COALESCES {
            merge_touching(free)
        } else {
            free
        };
        let free: Vec<(usize, usize)> = free.iter().map(|b| (b.addr, b.size)).collect();
        assemble(&segments, &allocated, &free, expandable)
    }
}

/// A core as a [`Tenant`](crate::resource::sleep::Tenant) of the pools below it that can sleep:
/// registered by the core itself when it is built over them (a suballocator on the core is a
/// tenant by construction), held by them as a `Weak` (gone with the core).
impl<F: FreeList> crate::resource::sleep::Tenant for CoreState<F> {
    fn segments(&self) -> Vec<SegmentInfo> {
        self.snapshot(None)
    }
}

/// What the `shared` mutex guards.
struct Shared<F> {
    fresh: F,
    /// Upstream chunks by address.
    chunks: BTreeMap<usize, Chunk>,
    pool_size: usize,
    /// Set when a failed allocation's last resort ran; cleared by growth and release.
    settled: Option<Settled>,
}

/// What the last resort of a failed allocation left behind: every list merged into the fresh
/// list (so no stream's list holds a free block) and, if `gave_back`, every fully free grown
/// chunk given back and the fresh list trimmed. It holds while the lists' free count is still
/// `frees` and nothing grew or was released since: the last resort would then change nothing,
/// and a failed allocation skips it.
#[derive(Clone, Copy, Debug)]
struct Settled {
    /// The sum of every list's free count when the lists were merged.
    frees: u64,
    /// Whether the fully free grown chunks were given back (and the fresh list trimmed).
    gave_back: bool,
}

/// Every stream's list.
struct Directory<F> {
    by_key: AddressMap<StreamKey, Arc<StreamList<F>>>,
    all: Vec<Arc<StreamList<F>>>,
}

/// Which default events to use over `upstream`.
pub(crate) fn default_events(upstream: &SharedResource) -> Arc<dyn StreamEvents> {
    default_events_for(upstream.kind(), upstream.device())
}

/// Which default events to use over memory of `kind` on `device`: CUDA events where work on
/// CUDA streams can use it ([`uses_device_streams`]), none otherwise.
pub(crate) fn default_events_for(kind: MemoryKind, device: Option<usize>) -> Arc<dyn StreamEvents> {
    use super::stream_events::{CudaStreamEvents, NoStreamEvents};
    if uses_device_streams(kind) {
        Arc::new(CudaStreamEvents::new(device))
    } else {
        Arc::new(NoStreamEvents)
    }
}

/// Whether work on CUDA streams can use memory of `kind`, so that reuse across streams must be
/// ordered with CUDA events: not for simulated memory (nothing runs on it), nor for any memory
/// on a machine without a CUDA driver (no stream exists there).
pub(crate) fn uses_device_streams(kind: MemoryKind) -> bool {
    kind != MemoryKind::Simulated && crate::cuda::driver_available()
}

/// What a suballocator on the core does with the memory it keeps free, said when it is built:
/// its link then registers it as a cache of its place or not (no call to remember).
pub(crate) enum Keeps {
    /// Freed memory kept for reuse and given back on a relief of its place (an allocation that
    /// ran out there, a process beside this one asking on a shared GPU): the suballocator's
    /// shared state, held weakly.
    Relievable(std::sync::Weak<dyn crate::pressure::Relieve>),
    /// Memory held until the resource drops (RMM's fixed-size resource): not a cache of its
    /// place, its free blocks count as held.
    UntilDropped,
}

/// A never reused id for a suballocator (a core, an arena): the key of its entries in the
/// per-thread caches, which must not take a new resource for a dropped one.
pub(crate) fn next_instance_id() -> u64 {
    // Why process-wide: the per-thread caches hold entries of every resource, so ids are unique.
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The most donor lists one steal looks at: a miss costs the same however many streams ever
/// existed. A block a steal does not reach is found by a later steal (they go round) or by the
/// merge of every list when growth fails.
const STEAL_VISITS: usize = 32;

impl<F: FreeList> StreamOrderedCore<F> {
    /// A core with no memory yet.
    pub(crate) fn new(
        events: Arc<dyn StreamEvents>,
        growth: Box<dyn Growth>,
        sizing: F::Sizing,
        name: &'static str,
        keeps: Keeps,
    ) -> Self {
        // Calls are answered from bookkeeping; growth and cross-stream waits call the source
        // under the core's locks, and foreign code in the source still counts.
        let link = growth
            .upstream()
            .map_or_else(
                || {
                    Link::source(
                        growth.kind(),
                        growth.device(),
                        growth.source_identity(),
                        growth.call_profile(),
                    )
                },
                |u| u.link(),
            )
            .suballocated();
        // A cache of its place by construction: a relief of the place reaches it.
        if let Keeps::Relievable(cache) = keeps {
            link.register_cache(cache);
        }
        let core = StreamOrderedCore {
            id: next_instance_id(),
            state: Arc::new(CoreState {
                shared: OwnedMutex::new(Shared {
                    fresh: F::new(&sizing),
                    chunks: BTreeMap::new(),
                    pool_size: 0,
                    settled: None,
                }),
                directory: RwLock::new(Directory {
                    by_key: AddressMap::default(),
                    all: Vec::new(),
                }),
            }),
            donors: Mutex::new(std::collections::BTreeSet::new()),
            with_free: Mutex::new(std::collections::BTreeSet::new()),
            steal_cursor: AtomicU32::new(0),
            events,
            growth,
            sizing,
            name,
            counters: PoolCounters::default(),
            last_free: AtomicUsize::new(0),
            linked: link.placement.is_some(),
            link,
        };
        // A tenant of every pool below whose memory moves, now and as the graph below grows.
        let tenant: std::sync::Weak<dyn crate::resource::sleep::Tenant> =
            Arc::downgrade(&core.state) as _;
        core.link.admit(&tenant);
        core
    }

    /// Adds exactly `bytes` from the source to the fresh list as the initial chunk
    /// (construction).
    /// The shared state, or [`Error::Logic`] when this thread holds it already: the source
    /// (a callback) called back into this resource while it was growing or giving back.
    fn lock_shared(&self) -> Result<OwnedGuard<'_, Shared<F>>> {
        self.state.shared.lock().map_err(|_| {
            Error::Logic(format!(
                "{}: called again from inside its own upstream call on this thread (an upstream \
                 or callback that uses the resource it serves); it would wait for itself",
                self.name
            ))
        })
    }

    /// Whether this thread is inside a call of this core that holds its shared state (its
    /// upstream calling back): its figures cannot be read from there.
    pub(crate) fn busy_here(&self) -> bool {
        self.state.shared.held_here()
    }

    pub(crate) fn preallocate(&self, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        if !self.growth.gives_back_chunks() {
            // A policy that grows in place maps its initial memory as it grows.
            let mut sh = self.lock_shared()?;
            let request = Request {
                bytes,
                size: bytes,
                stream: Stream::DEFAULT,
            };
            return self.grow(&mut sh, request);
        }
        let block = self.growth.initial_chunk(bytes)?;
        let mut sh = self.lock_shared()?;
        Self::add_chunk(&mut sh, block, true);
        self.counters.segment_added(bytes);
        Ok(())
    }

    fn add_chunk(sh: &mut Shared<F>, block: Block, initial: bool) {
        sh.chunks.insert(block.addr, Chunk { block, initial });
        sh.pool_size += block.size;
        sh.fresh.add_chunk(block);
        sh.settled = None;
    }

    /// The list of `key`, made on first use.
    fn list(&self, key: StreamKey) -> Arc<StreamList<F>> {
        if let Some(list) = self.state.directory.read().by_key.get(&key) {
            return list.clone();
        }
        let mut dir = self.state.directory.write();
        if let Some(list) = dir.by_key.get(&key) {
            return list.clone();
        }
        let list = Arc::new(StreamList {
            id: FRESH + 1 + dir.all.len() as ListId,
            key,
            state: Mutex::new(ListState::new(&self.sizing)),
        });
        dir.by_key.insert(key, list.clone());
        dir.all.push(list.clone());
        list
    }

    /// Calls `f` with the list of `key`: from this thread's cache when it is there.
    #[inline]
    fn with_list<R>(&self, key: StreamKey, f: impl Fn(&StreamList<F>) -> R) -> R {
        #[cfg(not(feature = "loom"))]
        if let Some(r) = super::stream_list::cache::with_cached(self.id, key, &f) {
            return r;
        }
        let list = self.list(key);
        #[cfg(not(feature = "loom"))]
        super::stream_list::cache::remember(self.id, key, list.clone());
        f(&list)
    }

    /// Allocates `bytes` on `stream`; see the module docs for the order of the searches.
    #[inline]
    pub(crate) fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        if bytes == 0 {
            return Ok(0);
        }
        // Placement below, or a pool of the process moving: the slow path (one load each).
        if self.linked || crate::resource::sleep::any_moving() {
            return self.allocate_linked(bytes, stream);
        }
        let ptr = self.carve(bytes, stream)?;
        if crate::resource::sleep::any_moving() {
            // A sleep may have begun while the block was carved (see `allocate_linked`).
            return self.after_carve(ptr, bytes, stream);
        }
        Ok(ptr)
    }

    /// `ptr`, carved for `bytes` on `stream`, unless a pool below began to sleep meanwhile: its
    /// offload may not have copied the block (free when it looked), so it goes back unused, and
    /// the allocation is made again once a sleep for the ledger woke (refused for a user's).
    #[inline(never)]
    fn after_carve(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<usize> {
        if !self.link.sleep.asleep() {
            return Ok(ptr);
        }
        self.deallocate(ptr, bytes, stream)?;
        self.allocate_linked(bytes, stream)
    }

    /// The most carves of one allocation while sleeps for the ledger begin under it (each one
    /// woken before the next carve).
    const CARVES_WHILE_WOKEN: usize = 8;

    /// A block from the lists (or growth) for `bytes` on `stream`.
    #[inline]
    fn carve(&self, bytes: usize, stream: Stream) -> Result<usize> {
        let request = Request {
            bytes,
            size: F::block_size_for(&self.sizing, bytes)?,
            stream,
        };
        let key = StreamKey::of(stream);
        self.with_list(key, |list| self.allocate_on(list, key, request))
    }

    /// [`Self::allocate`] over a link with placement, or while a pool of the process moves.
    #[inline(never)]
    fn allocate_linked(&self, bytes: usize, stream: Stream) -> Result<usize> {
        let mut carves = 0;
        let ptr = loop {
            // Refused while a pool below sleeps for its user; one asleep for the ledger wakes.
            self.link.sleep.check(self.name, bytes)?;
            let ptr = self.carve(bytes, stream)?;
            if !self.link.sleep.asleep() {
                break ptr;
            }
            // A sleep below began meanwhile: the block may lie on pages it unmaps.
            self.deallocate(ptr, bytes, stream)?;
            carves += 1;
            if carves == Self::CARVES_WHILE_WOKEN {
                return Err(crate::resource::sleep::asleep_below_error(self.name, bytes));
            }
        };
        if let Some(placer) = &self.link.placement {
            // Managed memory below whose blocks are placed as they are handed out.
            placer.place(ptr, bytes, stream);
        }
        Ok(ptr)
    }

    /// The stream's own list, then fresh memory if the shared lock is free at once, then the
    /// slow path.
    #[inline]
    fn allocate_on(&self, list: &StreamList<F>, key: StreamKey, request: Request) -> Result<usize> {
        {
            let mut st = list.state.lock();
            self.record_if_wanted(&mut st, list.id, key)?;
            if let Some(p) = st.take_counted(request.size) {
                return Ok(p);
            }
            // Taking the shared lock while holding a list's would invert the lock order;
            // `try_lock` never waits, so it cannot deadlock.
            if let Some(mut sh) = self.state.shared.try_lock() {
                if let Some(b) = sh.fresh.take(request.size) {
                    return Ok(st.adopt_counted(b));
                }
            }
        }
        self.allocate_slow(list, request).inspect_err(|e| {
            if e.is_out_of_memory() {
                self.counters.out_of_memory();
            }
        })
    }

    /// Everything after the stream's own list: fresh memory, steals, growth, merging.
    #[cold]
    fn allocate_slow(&self, list: &StreamList<F>, request: Request) -> Result<usize> {
        let size = request.size;
        let mut sh = self.lock_shared()?;
        {
            let mut st = list.state.lock();
            // A free on this stream may have come in since the fast path looked.
            if let Some(p) = st.take_counted(size) {
                return Ok(p);
            }
            if let Some(b) = sh.fresh.take(size) {
                return Ok(st.adopt_counted(b));
            }
        }
        if let Some(b) = self.steal(list, size)? {
            return Ok(list.record(b));
        }
        {
            let mut st = list.state.lock();
            if st.list.absorb_bordering(&mut sh.fresh) {
                if let Some(p) = st.take_counted(size) {
                    return Ok(p);
                }
            }
        }
        let grow_error = match self.grow(&mut sh, request) {
            Ok(()) => match sh.fresh.take(size) {
                Some(b) => return Ok(list.record(b)),
                None => Error::out_of_memory(
                    request.bytes,
                    format!("{}: grown chunk too small", self.name),
                ),
            },
            Err(e) if e.is_out_of_memory() => e,
            Err(e) => return Err(e),
        };
        self.last_resort(&mut sh, list, request, grow_error)
    }

    /// After growth failed with `grow_error`: every stream synchronized, every list merged,
    /// grown chunks given back (or free memory trimmed by the growth policy) and growth tried
    /// again. The merge and the give-back are skipped where they already ran with nothing
    /// freed, grown or released since ([`Settled`]): they would find nothing.
    fn last_resort(
        &self,
        sh: &mut Shared<F>,
        list: &StreamList<F>,
        request: Request,
        grow_error: Error,
    ) -> Result<usize> {
        let size = request.size;
        let settled = sh.settled.filter(|s| s.frees == self.frees());
        let frees = match settled {
            Some(s) => s.frees,
            None => {
                self.counters.retried();
                let frees = self.synchronize_and_merge(sh, false)?;
                if let Some(b) = sh.fresh.take(size) {
                    return Ok(list.record(b));
                }
                frees
            }
        };
        let mut error = grow_error;
        let mut gave_back = settled.is_some_and(|s| s.gave_back);
        if !gave_back && self.growth.may_grow_after_release(size) {
            gave_back = true;
            // Every fully free chunk, the initial one too: a request its free chunks cannot
            // hold is served by giving them back and growing one that can (RMM refuses it).
            let chunks = self.take_free_chunks(sh, true, 0);
            // Out of memory: trim everything free (keep nothing beyond what is allocated).
            let trimmed = match self.trim_fresh(sh, 0) {
                Ok(trimmed) => trimmed,
                Err(e) => {
                    Self::restore_chunks(sh, chunks);
                    return Err(e);
                }
            };
            if !chunks.is_empty() || trimmed > 0 {
                let (refused, failed) = self.give_back_chunks(chunks);
                if let Some(e) = failed {
                    Self::restore_chunks(sh, refused);
                    return Err(e);
                }
                match self.grow(sh, request) {
                    Ok(()) => {
                        return match sh.fresh.take(size) {
                            Some(b) => Ok(list.record(b)),
                            None => Err(error),
                        }
                    }
                    Err(e) if e.is_out_of_memory() => error = e,
                    Err(e) => return Err(e),
                }
            }
        }
        sh.settled = Some(Settled { frees, gave_back });
        Err(error)
    }

    /// The sum of every list's free count (it grows with every free).
    fn frees(&self) -> u64 {
        let dir = self.state.directory.read();
        dir.all
            .iter()
            .map(|list| list.state.lock().counters.frees())
            .sum()
    }

    /// A block from another stream's list, after the event wait (see the ordering rules). Looks
    /// at no more than [`STEAL_VISITS`] donor lists, from where the last steal stopped (so
    /// repeated misses go round all of them), and drops from the donors the lists it finds
    /// empty or holding a fitting block its stream has not recorded after.
    fn steal(&self, list: &StreamList<F>, size: usize) -> Result<Option<Block>> {
        let ids: Vec<ListId> = {
            let donors = self.donors.lock();
            let from = self.steal_cursor.load(Ordering::Relaxed);
            donors
                .range(from..)
                .chain(donors.range(..from))
                .copied()
                .filter(|&id| id != list.id)
                .take(STEAL_VISITS)
                .collect()
        };
        if ids.is_empty() {
            return Ok(None);
        }
        let dir = self.state.directory.read();
        for id in ids {
            self.steal_cursor.store(id + 1, Ordering::Relaxed);
            let Some(other) = dir.all.get((id - FRESH - 1) as usize) else {
                continue;
            };
            let mut st = other.state.lock();
            if st.list.free_blocks() == 0 {
                self.leave_donors(&mut st, id);
                continue;
            }
            if !st.list.can_take(size) {
                continue;
            }
            if st.marks.unrecorded {
                // Frees after the list's last record: ask the stream's next user to record (it
                // rejoins the donors then), and look elsewhere meanwhile (never record on another
                // stream from here: it may have been destroyed since its frees).
                st.marks.wanted = true;
                self.leave_donors(&mut st, id);
                continue;
            }
            self.events.make_wait(list.key, other.key)?;
            return Ok(st.list.take(size));
        }
        Ok(None)
    }

    /// Puts list `id` (its lock held as `st`) in the donor set.
    #[inline]
    fn join_donors(&self, st: &mut ListState<F>, id: ListId) {
        if !st.in_donors {
            st.in_donors = true;
            self.donors.lock().insert(id);
        }
    }

    /// Notes that list `id` (its lock held as `st`) may hold free blocks.
    #[inline]
    fn note_free(&self, st: &mut ListState<F>, id: ListId) {
        if !st.in_with_free {
            st.in_with_free = true;
            self.with_free.lock().insert(id);
        }
    }

    /// Takes list `id` (its lock held as `st`) out of the donor set.
    fn leave_donors(&self, st: &mut ListState<F>, id: ListId) {
        if st.in_donors {
            st.in_donors = false;
            self.donors.lock().remove(&id);
        }
    }

    /// Adds a chunk of at least `request.size` bytes from the upstream to the fresh list.
    fn grow(&self, sh: &mut Shared<F>, request: Request) -> Result<()> {
        self.grow_by(sh, request, false)
    }

    /// Adds free memory for a block of `bytes` to the fresh list, mapping only what that block
    /// needs beside the free memory there (no growth step ahead), for a policy that grows in
    /// place (an expandable pool: `map_to`). Nothing is allocated.
    pub(crate) fn grow_exactly(&self, bytes: usize) -> Result<()> {
        let mut sh = self.lock_shared()?;
        let request = Request {
            bytes,
            size: bytes,
            stream: Stream::DEFAULT,
        };
        self.grow_by(&mut sh, request, true)
    }

    /// [`grow`](Self::grow), with or without the policy's growth step ahead (`exact`).
    fn grow_by(&self, sh: &mut Shared<F>, request: Request, exact: bool) -> Result<()> {
        let chunk = self.growth.grow_beside(
            GrowRequest {
                bytes: request.bytes,
                size: request.size,
                held: sh.pool_size,
                stream: request.stream,
                exact,
            },
            &sh.fresh,
        )?;
        Self::add_chunk(sh, chunk, false);
        match self.growth.segments() {
            Some(segments) => {
                self.counters.mapped(chunk.size);
                self.counters.set_segments(segments.len());
            }
            None => self.counters.segment_added(chunk.size),
        }
        Ok(())
    }

    /// Lets the growth policy trim free memory of the fresh list (after a synchronize-and-merge)
    /// while more than `keep` bytes are held; the bytes it gave back.
    fn trim_fresh(&self, sh: &mut Shared<F>, keep: usize) -> Result<usize> {
        let (trimmed, outcome) = self.growth.trim(&mut sh.fresh, keep);
        if trimmed > 0 {
            sh.pool_size -= trimmed;
            self.counters.unmapped(trimmed);
            if let Some(segments) = self.growth.segments() {
                self.counters.set_segments(segments.len());
            }
        }
        outcome.map(|()| trimmed)
    }

    /// Takes every stream's free blocks out, synchronizes every stream, and puts the blocks in
    /// the fresh list; the sum of the lists' free counts read as they were drained. On a failed
    /// synchronisation the blocks go back to their lists. When no list holds a free block, the
    /// streams are synchronized only if `always_sync` (the fresh list holds no block used since
    /// its last synchronization: frees go to the streams' lists).
    fn synchronize_and_merge(&self, sh: &mut Shared<F>, always_sync: bool) -> Result<u64> {
        let dir = self.state.directory.read();
        let mut frees = 0;
        let drained: Vec<Vec<Block>> = dir
            .all
            .iter()
            .map(|list| {
                let mut st = list.state.lock();
                frees += st.counters.frees();
                if st.list.free_blocks() == 0 {
                    return Vec::new();
                }
                st.marks = ListMarks::default();
                st.list.drain()
            })
            .collect();
        if !always_sync && drained.iter().all(Vec::is_empty) {
            return Ok(frees);
        }
        self.counters.synchronized_all();
        if let Err(e) = self.events.synchronize_all() {
            for (list, blocks) in dir.all.iter().zip(drained) {
                let mut st = list.state.lock();
                if !blocks.is_empty() {
                    // Not known to be recorded after these frees any more.
                    st.marks.unrecorded = true;
                    self.note_free(&mut st, list.id);
                }
                for b in blocks {
                    st.list.insert(b);
                }
            }
            return Err(e);
        }
        for b in drained.into_iter().flatten() {
            sh.fresh.insert(b);
        }
        Ok(frees)
    }

    /// Takes the fully free chunks (grown ones only, unless `initial_too`) out of the fresh list
    /// and the chunk table, while more than `keep` bytes are held; the caller gives them back
    /// ([`Self::give_back_chunks`]) and puts back the ones that failed ([`Self::restore_chunks`]).
    fn take_free_chunks(&self, sh: &mut Shared<F>, initial_too: bool, keep: usize) -> Vec<Chunk> {
        if !self.growth.gives_back_chunks() {
            return Vec::new();
        }
        let Shared {
            fresh,
            chunks,
            pool_size,
            ..
        } = sh;
        let mut out = Vec::new();
        chunks.retain(|_, c| {
            let goes =
                *pool_size > keep && (initial_too || !c.initial) && fresh.remove_block(c.block);
            if goes {
                *pool_size -= c.block.size;
                out.push(*c);
            }
            !goes
        });
        out
    }

    /// Gives `chunks` (taken out by [`Self::take_free_chunks`] after a synchronize-and-merge)
    /// back to the upstream, trying every chunk; the chunks the upstream refused, with the first
    /// error. A refused chunk is still held (the upstream did not take it): the caller puts it
    /// back in the books with [`Self::restore_chunks`], free, so a later release tries again.
    fn give_back_chunks(&self, chunks: Vec<Chunk>) -> (Vec<Chunk>, Option<Error>) {
        let mut first_error = None;
        let mut refused = Vec::new();
        for chunk in chunks {
            // SAFETY: each chunk was a whole free block of the fresh list, taken out of it and
            // of the chunk table (so given back once) after every stream was synchronized: no
            // block of it is allocated and no work uses it.
            #[allow(unsafe_code)]
            let given = unsafe { self.growth.give_back(chunk.block) };
            match given {
                Ok(()) => self.counters.segment_removed(chunk.block.size),
                Err(e) => {
                    first_error.get_or_insert(e);
                    refused.push(chunk);
                }
            }
        }
        (refused, first_error)
    }

    /// Puts chunks the upstream refused to take back into the books: in the chunk table, counted
    /// in the pool size, and free in the fresh list (as they were before the give-back).
    fn restore_chunks(sh: &mut Shared<F>, refused: Vec<Chunk>) {
        for c in refused {
            sh.chunks.insert(c.block.addr, c);
            sh.pool_size += c.block.size;
            sh.fresh.add_chunk(c.block);
        }
        sh.settled = None;
    }

    /// Frees `ptr`, allocated with `bytes`, on `stream` into that stream's list. A pointer not
    /// allocated here (or freed already), or a size that gives another block size than the
    /// allocation's, is [`Error::Logic`] and changes nothing.
    #[inline]
    pub(crate) fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        let key = StreamKey::of(stream);
        let freed = self.with_list(key, move |list| {
            {
                let mut st = list.state.lock();
                match st.list.free_allocated(ptr, bytes) {
                    Found::Yes(size) => return self.after_free(&mut st, list.id, key, size),
                    Found::OtherSize(actual) => return Err(self.wrong_size(ptr, bytes, actual)),
                    Found::No => {}
                }
            }
            self.deallocate_foreign(list, key, ptr, bytes)
        });
        if freed.is_ok() && crate::resource::sleep::index::any_tagged() {
            self.forget_tag(ptr);
        }
        freed
    }

    /// A tag of the block at `ptr` (in a pool below that can sleep) goes with its free.
    #[inline(never)]
    fn forget_tag(&self, ptr: usize) {
        self.link.sleep.forget(ptr);
    }

    /// The error of a free of `ptr` with `bytes` whose block has `actual` bytes.
    #[cold]
    fn wrong_size(&self, ptr: usize, bytes: usize, actual: usize) -> Error {
        Error::Logic(format!(
            "{}: deallocate of {ptr:#x} with {bytes} bytes, but its block has {actual} bytes \
             (allocated with another size)",
            self.name
        ))
    }

    /// The event marks after a free into a stream's list (the list's lock held).
    #[inline]
    fn after_free(
        &self,
        st: &mut ListState<F>,
        id: ListId,
        key: StreamKey,
        size: usize,
    ) -> Result<()> {
        st.counters.freed(size);
        st.marks.unrecorded = true;
        self.join_donors(st, id);
        self.note_free(st, id);
        // A free may come after its stream was destroyed (a CuPy array outliving its stream):
        // only a per-thread default stream, alive as long as its thread, is recorded on here;
        // any other stream is recorded on at its next allocation, which proves it alive.
        if key.is_per_thread() {
            self.record_if_wanted(st, id, key)?;
        }
        Ok(())
    }

    /// A free of a block allocated on another stream (or never allocated here).
    #[cold]
    fn deallocate_foreign(
        &self,
        list: &StreamList<F>,
        key: StreamKey,
        ptr: usize,
        bytes: usize,
    ) -> Result<()> {
        // The directory stays read-locked until the block is in this list: a consistent view
        // ([`Self::with_all_lists`], which write-locks it) never sees the block in both lists
        // (or in neither).
        let dir = self.state.directory.read();
        let found = dir
            .all
            .iter()
            .filter(|other| other.id != list.id)
            .map(|other| other.state.lock().list.forget(ptr, bytes))
            .find(|found| *found != Found::No);
        let block = match found {
            Some(Found::Yes(block)) => block,
            Some(Found::OtherSize(actual)) => return Err(self.wrong_size(ptr, bytes, actual)),
            _ => {
                return Err(Error::Logic(format!(
                    "deallocate of {ptr:#x}, which this resource did not allocate (or was freed)"
                )))
            }
        };
        let mut st = list.state.lock();
        st.list.insert(block);
        let done = self.after_free(&mut st, list.id, key, block.size);
        drop(st);
        drop(dir);
        done
    }

    /// On the owner thread of a per-thread default stream's list: records the list's event if
    /// another thread asked for it and the list had frees since the last record.
    #[inline]
    fn record_if_wanted(&self, st: &mut ListState<F>, id: ListId, key: StreamKey) -> Result<()> {
        let marks = &mut st.marks;
        if marks.wanted && marks.unrecorded {
            self.events.record_after_free(key)?;
            *marks = ListMarks::default();
            if st.list.free_blocks() > 0 {
                self.join_donors(st, id);
            }
        }
        Ok(())
    }

    /// Synchronizes, merges, gives every fully free upstream chunk back (and lets the growth
    /// policy trim while more than `keep` bytes are held); bytes released.
    pub(crate) fn release(&self, keep: usize) -> Result<usize> {
        let sh = self.lock_shared()?;
        self.release_locked(sh, 0, keep)
    }

    /// Synchronizes, merges and trims free pages until at most `keep()` bytes stay mapped
    /// (read once synchronized; `0`: every free page, as `release(0)` for a policy that trims,
    /// chunks kept), then runs `work` while still holding the shared state, so that no
    /// block is carved from the merged free lists meanwhile; returns the bytes trimmed and what
    /// `work` returned. For moves of the pool's pages (promotion) that must not race a block
    /// being handed out on them.
    pub(crate) fn trim_then<T>(
        &self,
        keep: impl FnOnce() -> usize,
        work: impl FnOnce() -> Result<T>,
    ) -> Result<(usize, T)> {
        let mut sh = self.lock_shared()?;
        self.synchronize_and_merge(&mut sh, true)?;
        sh.settled = None;
        let trimmed = self.trim_fresh(&mut sh, keep())?;
        let out = work()?;
        drop(sh);
        Ok((trimmed, out))
    }

    /// As [`Self::release`], giving chunks back only while more than `keep` bytes are held
    /// (in address order), and only if the shared state can be taken at once (`Ok(0)` when
    /// another thread, or this one, holds it): for reliefs and caches over their limit, which
    /// must never wait for a lock.
    pub(crate) fn try_release_to(&self, keep: usize) -> Result<usize> {
        match self.state.shared.try_lock() {
            Some(sh) => self.release_locked(sh, keep, keep),
            None => Ok(0),
        }
    }

    fn release_locked(
        &self,
        mut sh: OwnedGuard<'_, Shared<F>>,
        keep_chunks: usize,
        keep_trimmed: usize,
    ) -> Result<usize> {
        let (chunks, trimmed, chunks_bytes) = {
            self.synchronize_and_merge(&mut sh, true)?;
            sh.settled = None;
            let chunks = self.take_free_chunks(&mut sh, true, keep_chunks);
            let trimmed = match self.trim_fresh(&mut sh, keep_trimmed) {
                Ok(trimmed) => trimmed,
                Err(e) => {
                    Self::restore_chunks(&mut sh, chunks);
                    return Err(e);
                }
            };
            drop(sh);
            let bytes = chunks.iter().map(|c| c.block.size).sum::<usize>();
            (chunks, trimmed, bytes)
        };
        let (refused, failed) = self.give_back_chunks(chunks);
        if let Some(e) = failed {
            // The upstream still holds what it refused: back in the books, free, retried by a
            // later release (or at drop).
            let mut sh = self.lock_shared()?;
            Self::restore_chunks(&mut sh, refused);
            return Err(e);
        }
        let released: usize = chunks_bytes;
        Ok(released + trimmed)
    }

    /// Reads the shared state; `None` when this thread holds it (see [`Self::busy_here`]).
    fn read_shared<T>(&self, f: impl FnOnce(&Shared<F>) -> T) -> Option<T> {
        self.state.shared.lock().ok().map(|sh| f(&sh))
    }

    /// Bytes held from the upstream (0 from inside its own upstream call, see
    /// [`Self::busy_here`]).
    pub(crate) fn pool_size(&self) -> usize {
        self.read_shared(|sh| sh.pool_size).unwrap_or(0)
    }

    /// Number of upstream chunks held (0 from inside its own upstream call).
    pub(crate) fn chunk_count(&self) -> usize {
        self.read_shared(|sh| sh.chunks.len()).unwrap_or(0)
    }

    fn with_all_lists<T>(
        &self,
        f: impl FnOnce(Option<&Shared<F>>, &[Arc<StreamList<F>>]) -> T,
    ) -> T {
        self.state.with_all_lists(f)
    }

    /// Calls `f` on every stream list that may hold free blocks (each locked in turn), and
    /// drops from that set the lists found empty; under a consistent view
    /// ([`Self::with_all_lists`]), so the cost follows the lists with free memory, not every
    /// stream that ever existed.
    fn for_lists_with_free(&self, lists: &[Arc<StreamList<F>>], mut f: impl FnMut(&F)) {
        let ids: Vec<ListId> = self.with_free.lock().iter().copied().collect();
        for id in ids {
            let Some(list) = lists.get((id - FRESH - 1) as usize) else {
                continue;
            };
            let mut st = list.state.lock();
            if st.list.free_blocks() == 0 {
                st.in_with_free = false;
                self.with_free.lock().remove(&id);
                continue;
            }
            f(&st.list);
        }
    }

    /// Free bytes over all lists.
    pub(crate) fn free_bytes(&self) -> usize {
        let bytes = self.with_all_lists(|sh, lists| self.free_in(sh, lists));
        self.last_free.store(bytes, Ordering::Relaxed);
        bytes
    }

    /// Free bytes of the fresh list (where the shared state is at hand) and of `lists`.
    fn free_in(&self, sh: Option<&Shared<F>>, lists: &[Arc<StreamList<F>>]) -> usize {
        let mut bytes = sh.map_or(0, |sh| sh.fresh.free_bytes());
        self.for_lists_with_free(lists, |l| bytes += l.free_bytes());
        bytes
    }

    /// Free bytes over all lists, never waiting for the core's locks: the figure now where they
    /// can be taken at once, else the last one read (a pool growing or giving back holds them,
    /// maybe for as long as it waits for other processes: a process's figures are read by the
    /// thread that answers them).
    pub(crate) fn free_bytes_now_or_last(&self) -> usize {
        let now = self
            .state
            .try_with_all_lists(|sh, lists| self.free_in(Some(sh), lists));
        match now {
            Some(bytes) => {
                self.last_free.store(bytes, Ordering::Relaxed);
                bytes
            }
            None => self.last_free.load(Ordering::Relaxed),
        }
    }

    /// Free blocks over all lists (touching blocks of different lists counted once where the
    /// lists coalesce).
    pub(crate) fn free_blocks(&self) -> usize {
        self.free_figures().2
    }

    /// Free bytes, largest free block and free blocks over all lists, from one consistent view.
    /// Where the lists coalesce, free blocks of different lists that touch (a stream's freed
    /// block beside fresh memory) are one free region: a request of their joint size succeeds
    /// (after the synchronize-and-merge), so they count as one block of their joint size.
    fn free_figures(&self) -> (usize, usize, usize) {
        self.with_all_lists(|fresh, lists| {
            let mut per_list = Vec::new();
            if let Some(fresh) = fresh.map(|sh| &sh.fresh) {
                per_list.push((
                    fresh.free_bytes(),
                    fresh.largest_free_block(),
                    fresh.free_blocks(),
                    F::COALESCES.then(|| fresh.free_ranges()),
                ));
            }
            self.for_lists_with_free(lists, |l| {
                per_list.push((
                    l.free_bytes(),
                    l.largest_free_block(),
                    l.free_blocks(),
                    F::COALESCES.then(|| l.free_ranges()),
                ));
            });
            let non_empty = per_list.iter().filter(|l| l.2 > 0).count();
            if !F::COALESCES || non_empty < 2 {
                return per_list
                    .iter()
                    .fold((0, 0, 0), |(b, l, n), x| (b + x.0, l.max(x.1), n + x.2));
            }
            let ranges: Vec<Block> = per_list.into_iter().flat_map(|x| x.3).flatten().collect();
            let merged = merge_touching(ranges);
            merged
                .iter()
                .fold((0, 0, 0), |(b, l, n), r| (b + r.size, l.max(r.size), n + 1))
        })
    }

    /// Free bytes on `stream`'s own list and on other streams' lists (the fresh list, free for
    /// every stream, is in neither).
    pub(crate) fn stream_free(&self, stream: Stream) -> StreamFree {
        let key = StreamKey::of(stream);
        let mut out = StreamFree::default();
        for list in &self.state.directory.read().all {
            let free = list.state.lock().list.free_bytes();
            if list.key == key {
                out.this_stream += free;
            } else if free > 0 {
                out.other_streams += free;
                out.other_lists += 1;
            }
        }
        out
    }

    /// Footprint: held bytes, free bytes, largest free block, free blocks (see
    /// [`Self::free_figures`]).
    pub(crate) fn footprint(&self) -> Footprint {
        let (free_bytes, largest_free_block, free_blocks) = self.free_figures();
        Footprint {
            held_bytes: self.pool_size(),
            free_bytes,
            largest_free_block,
            free_blocks,
        }
    }
}

/// `blocks` sorted by address, with blocks of one region that touch joined.
fn merge_touching(mut blocks: Vec<Block>) -> Vec<Block> {
    blocks.sort_unstable_by_key(|b| b.addr);
    let mut out: Vec<Block> = Vec::with_capacity(blocks.len());
    for b in blocks {
        match out.last_mut() {
            Some(last) if last.end() == b.addr && last.region == b.region => last.size += b.size,
            _ => out.push(b),
        }
    }
    out
}

impl<F: FreeList> StreamOrderedCore<F> {
    /// The size of the block this pool handed out (and that is not freed) starting at `addr`:
    /// each stream list looked up in turn, O(lists), not O(blocks) as a snapshot. A block moving
    /// between lists (a free on another stream) may be missed for that moment.
    pub(crate) fn allocated_at(&self, addr: usize) -> Option<usize> {
        let dir = self.state.directory.read();
        dir.all
            .iter()
            .find_map(|list| list.state.lock().list.allocated_size_at(addr))
    }

    /// The block this pool handed out (and that is not freed) holding `addr`, as (start,
    /// size): O(lists) where `addr` starts it, else O(blocks) (a view into a block).
    pub(crate) fn allocated_holding(&self, addr: usize) -> Option<(usize, usize)> {
        if let Some(size) = self.allocated_at(addr) {
            return Some((addr, size));
        }
        let dir = self.state.directory.read();
        dir.all
            .iter()
            .find_map(|list| list.state.lock().list.allocated_block_holding(addr))
    }

    /// Every segment (upstream chunk, or the growth policy's own) with its blocks.
    pub(crate) fn snapshot(&self) -> Vec<SegmentInfo> {
        let mut segments = self.state.snapshot(self.growth.segments());
        if self.growth.offloaded() || self.link.asleep() {
            for s in &mut segments {
                s.offloaded = true;
            }
        }
        segments
    }

    /// The PyTorch-style figures: the lists' allocation counters, the pool-wide ones, and the
    /// split figures from a snapshot.
    pub(crate) fn memory_stats(&self) -> MemoryStats {
        let mut stats = self.counters.get();
        for list in &self.state.directory.read().all {
            list.state.lock().counters.add_to(&mut stats);
        }
        for segment in self.snapshot() {
            if segment.allocated_size() == 0 {
                continue;
            }
            for b in segment
                .blocks
                .iter()
                .filter(|b| b.state == BlockState::Free)
            {
                stats.inactive_split += 1;
                stats.inactive_split_bytes += b.size as u64;
            }
        }
        if self.growth.offloaded() || self.link.asleep() {
            // Asleep (this pool, or one below it): nothing is mapped; what it holds is on the
            // host or discarded until the wake.
            stats.offloaded_bytes = stats.reserved_bytes.current;
            stats.reserved_bytes.current = 0;
        }
        stats
    }

    /// Sets every peak of [`Self::memory_stats`] to its current value.
    pub(crate) fn reset_peak_memory_stats(&self) {
        self.counters.reset_peaks();
        for list in &self.state.directory.read().all {
            list.state.lock().counters.reset_peaks();
        }
    }
}

impl<F: FreeList> PoolReport for StreamOrderedCore<F> {
    fn footprint(&self) -> Footprint {
        StreamOrderedCore::footprint(self)
    }

    fn held_bytes(&self) -> usize {
        self.pool_size()
    }

    fn memory_stats(&self) -> Option<MemoryStats> {
        Some(StreamOrderedCore::memory_stats(self))
    }

    fn reset_peak_memory_stats(&self) -> bool {
        StreamOrderedCore::reset_peak_memory_stats(self);
        true
    }

    fn memory_snapshot(&self) -> Option<Vec<SegmentInfo>> {
        Some(StreamOrderedCore::snapshot(self))
    }

    fn stream_free(&self, stream: Stream) -> Option<StreamFree> {
        Some(StreamOrderedCore::stream_free(self, stream))
    }

    fn busy(&self) -> bool {
        self.busy_here()
    }
}

impl<F: FreeList> MemoryResource for StreamOrderedCore<F> {
    #[inline]
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        StreamOrderedCore::allocate(self, bytes, stream)
    }

    #[inline]
    // The trait's method is unsafe; this body checks the pointer and size against the blocks it
    // handed out (a bogus, double or wrong-size free is `Error::Logic`) and relies only on the
    // stream-ordering part of the contract.
    #[allow(unsafe_code)]
    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        StreamOrderedCore::deallocate(self, ptr, bytes, stream)
    }

    crate::resource::memory_from!(|this| this.growth);

    fn memory_info(&self) -> Option<(usize, usize)> {
        self.growth.memory_info(self.pool_size(), self.free_bytes())
    }

    fn report(&self) -> Option<&dyn PoolReport> {
        Some(self)
    }

    fn upstreams(&self) -> Vec<SharedResource> {
        self.growth.upstream().into_iter().cloned().collect()
    }

    fn link(&self) -> Link {
        self.link.clone()
    }

    fn name(&self) -> &'static str {
        self.name
    }
}

/// Implements [`MemoryResource`] for a handle type by forwarding every method to the core that
/// `$core` (an expression of `$this`) names.
macro_rules! forward_memory_resource {
    ($ty:ty, |$this:ident| $core:expr) => {
        forward_memory_resource!(
            $ty,
            |$this| $core,
            after_allocate: |_ptr, _bytes, _stream| ()
        );
    };
    // `after_allocate` runs after each allocation that succeeded (the pool places blocks there).
    ($ty:ty, |$this:ident| $core:expr, after_allocate: |$p:ident, $b:ident, $s:ident| $after:expr) => {
        impl $crate::resource::MemoryResource for $ty {
            #[inline]
            fn allocate(
                &self,
                bytes: usize,
                stream: $crate::cuda::Stream,
            ) -> $crate::error::Result<usize> {
                let $this = self;
                let ptr = $crate::resource::MemoryResource::allocate($core, bytes, stream)?;
                let ($p, $b, $s) = (ptr, bytes, stream);
                $after;
                Ok(ptr)
            }

            #[inline]
            // The core checks every free against the blocks it handed out (a bogus or double
            // free is `Error::Logic`) and relies only on the stream-ordering part of the
            // contract.
            #[allow(unsafe_code)]
            unsafe fn deallocate(
                &self,
                ptr: usize,
                bytes: usize,
                stream: $crate::cuda::Stream,
            ) -> $crate::error::Result<()> {
                let $this = self;
                // The core's inherent (checked, safe) `deallocate`.
                ($core).deallocate(ptr, bytes, stream)
            }

            fn kind(&self) -> $crate::resource::MemoryKind {
                let $this = self;
                $crate::resource::MemoryResource::kind($core)
            }

            fn device(&self) -> Option<usize> {
                let $this = self;
                $crate::resource::MemoryResource::device($core)
            }

            fn memory_info(&self) -> Option<(usize, usize)> {
                let $this = self;
                $crate::resource::MemoryResource::memory_info($core)
            }

            fn report(&self) -> Option<&dyn $crate::report::PoolReport> {
                let $this = self;
                $crate::resource::MemoryResource::report($core)
            }

            fn upstreams(&self) -> Vec<$crate::resource::SharedResource> {
                let $this = self;
                $crate::resource::MemoryResource::upstreams($core)
            }

            fn link(&self) -> $crate::resource::Link {
                let $this = self;
                $crate::resource::MemoryResource::link($core)
            }

            fn as_any(&self) -> Option<&dyn std::any::Any> {
                Some(self)
            }

            fn name(&self) -> &'static str {
                let $this = self;
                $crate::resource::MemoryResource::name($core)
            }
        }
    };
}
pub(crate) use forward_memory_resource;

impl<F: FreeList> Drop for StreamOrderedCore<F> {
    fn drop(&mut self) {
        let _ = self.events.synchronize_all();
        let chunks = match self.state.shared.lock() {
            Ok(mut sh) => std::mem::take(&mut sh.chunks),
            Err(_) => BTreeMap::new(),
        };
        for chunk in chunks.into_values() {
            // SAFETY: the core is dropping, so no block is allocated any more (the handles that
            // could free them are gone), every stream was just synchronized, and the chunk
            // table held each chunk once.
            #[allow(unsafe_code)]
            let _ = unsafe { self.growth.give_back(chunk.block) };
        }
        // Per-thread caches may still hold the lists: leave them empty.
        for list in &self.state.directory.read().all {
            *list.state.lock() = ListState::new(&self.sizing);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::growth::FreeRanges;
    use super::super::stream_events::NoStreamEvents;
    use super::*;
    use crate::suballocator::free_lists::CoalescingFreeList;

    /// A policy like the expandable pool's: one address range, grown by "mapping" at its end
    /// (one region, so extensions coalesce), trimmed whole on release.
    #[derive(Debug, Default)]
    struct OneRange {
        mapped: std::sync::Mutex<usize>,
    }

    const BASE: usize = 0x7000_0000;

    impl Growth for OneRange {
        fn grow(&self, request: GrowRequest) -> Result<Block> {
            let mut mapped = self
                .mapped
                .lock()
                .map_err(|_| Error::Logic("poisoned".into()))?;
            let size = request.size.max(4096);
            let block = Block {
                addr: BASE + *mapped,
                size,
                region: BASE,
            };
            *mapped += size;
            Ok(block)
        }
        #[allow(unsafe_code)]
        unsafe fn give_back(&self, _chunk: Block) -> Result<()> {
            Ok(())
        }
        fn trim(&self, fresh: &mut dyn FreeRanges, _keep: usize) -> (usize, Result<()>) {
            let mut trimmed = 0;
            for b in fresh.ranges() {
                assert!(fresh.take_range(b.addr, b.size));
                trimmed += b.size;
            }
            (trimmed, Ok(()))
        }
    }

    #[test]
    fn a_range_grown_at_its_end_coalesces_and_trims() {
        let core = StreamOrderedCore::<CoalescingFreeList>::new(
            Arc::new(NoStreamEvents),
            Box::new(OneRange::default()),
            (),
            "one_range",
            Keeps::UntilDropped,
        );
        // SAFETY: a key only: nothing passes it to the driver.
        #[allow(unsafe_code)]
        let s = unsafe { Stream::from_raw(0x1000) };
        let a = core.allocate(4096, s).unwrap();
        let b = core.allocate(4096, s).unwrap();
        assert_eq!((a, b), (BASE, BASE + 4096));
        core.deallocate(a, 4096, s).unwrap();
        core.deallocate(b, 4096, s).unwrap();
        assert_eq!(
            core.free_blocks(),
            1,
            "two extensions of one range coalesce"
        );
        let c = core.allocate(8192, s).unwrap();
        assert_eq!((c, core.pool_size()), (BASE, 8192), "served with no growth");
        core.deallocate(c, 8192, s).unwrap();
        assert_eq!(core.release(0).unwrap(), 8192, "trimmed");
        assert_eq!((core.pool_size(), core.free_bytes()), (0, 0));
        assert_eq!(core.allocate(256, s).unwrap(), BASE + 8192);
        assert_eq!(core.name(), "one_range");
    }
}
