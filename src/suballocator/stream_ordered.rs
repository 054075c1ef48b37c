//! The one stream-ordered core that the pool and the fixed-size resource plug their strategy
//! into (RMM's `stream_ordered_memory_resource`).
//!
//! # Ordering rules
//! - Each stream ([`StreamKey`]) has its own free list. Memory freed on stream A goes to A's list
//!   and is reused by later allocations on A at once, with no CUDA call on that path.
//! - Memory fresh from the upstream sits in the fresh list ([`FRESH`]): it belongs to no stream
//!   and any stream takes it without a wait. A block freed on A coalesces at once with free
//!   neighbours in A's list only. Fresh memory stays fresh when a neighbour is freed (were it
//!   absorbed, the first free beside the fresh tail would hand all fresh memory to one stream,
//!   and every other stream would then wait on that stream's work: cold-start serialization).
//!   Only when A's allocation finds no fit anywhere, before growing, do the fresh blocks that
//!   border A's free blocks move into A's list, coalesced (the sound direction: fresh memory
//!   may become A's, never the reverse).
//! - An allocation on B that neither B's list nor the fresh list can serve takes a block from
//!   another stream A's list only after [`StreamEvents::make_wait`]`(B, A)`: an event recorded on
//!   A (after every free into A's list) and waited on by B. One event per owner stream, reused.
//! - When nothing fits, the pool grows from the upstream (into the fresh list). When growth fails,
//!   the core synchronizes every stream ([`StreamEvents::synchronize_all`]), merges every list into
//!   the fresh one (coalescing across them), retries, then gives fully free upstream chunks back
//!   and grows again, before reporting out of memory.
//!
//! # Per-thread default streams
//! Another thread cannot record an event on a thread's per-thread default stream (PTDS), so a
//! PTDS list is handled lazily, with no CUDA call on its own allocate/free path either: a free
//! marks the list "unrecorded". A thread that would take memory from another thread's PTDS list
//! takes it only when the list's event was recorded after its latest free (then it waits on that
//! event); otherwise it marks the list "wanted" and looks elsewhere (fresh memory, growth, and in
//! the end the synchronize-and-merge path). The owner thread records the event at its next
//! allocate or free on that stream when the list is both unrecorded and wanted.
//!
//! # Fresh chunks
//! Chunks from the upstream are assumed usable by every stream at once. This holds for the
//! synchronous upstreams (cuda, managed, pinned, simulated); over a stream-ordered upstream
//! (cuda_async) the chunk is allocated on the requesting stream.
//!
//! # Locking
//! One mutex guards the state today. The per-stream part of the state (one list id per stream,
//! its size classes in the strategy) is separate from the shared part (upstream chunks, pool
//! size), so the lock can later be split into a lock per stream list plus one for growth.

#![deny(unsafe_code)]

use super::coalescing_free_list::AddressMap;
use super::stream_events::{StreamEvents, StreamKey};
use crate::cuda::Stream;
use crate::error::{Error, Result};
use crate::resource::{Footprint, SharedResource, ALLOCATION_ALIGNMENT};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Index of a free list in a strategy; dense, assigned in order by [`FreeList::add_list`].
pub(crate) type ListId = u32;

/// The list of memory fresh from the upstream, which belongs to no stream.
pub(crate) const FRESH: ListId = 0;

/// A suballocation strategy: how requests are sized, how a block is carved from a list, and how a
/// freed one goes back. Pure bookkeeping on addresses; no CUDA calls.
pub(crate) trait FreeList: Send + 'static {
    /// The block size handed out for a request of `bytes` (> 0).
    ///
    /// # Errors
    /// Out of memory for a request this strategy can never serve.
    fn block_size_for(&self, bytes: usize) -> Result<usize>;

    /// Adds an empty list (for a new stream) and returns its id.
    fn add_list(&mut self) -> ListId;

    /// Whether [`FreeList::take`] would succeed.
    fn can_take(&self, list: ListId, size: usize) -> bool;

    /// Takes a block of `size` bytes (as from [`FreeList::block_size_for`]) from `list`.
    fn take(&mut self, list: ListId, size: usize) -> Option<usize>;

    /// Puts back a block taken earlier, freed on the stream of `list`.
    ///
    /// # Errors
    /// A logic error for a block the strategy can tell it did not hand out.
    fn give_back(&mut self, list: ListId, addr: usize, size: usize) -> Result<()>;

    /// Adds a chunk fresh from the upstream to the fresh list.
    fn add_chunk(&mut self, addr: usize, size: usize);

    /// Moves the free fresh blocks that border a free block of `list` into `list`, coalesced;
    /// whether any moved. Called before growing, so a stream's freed blocks and the fresh memory
    /// beside them still combine.
    fn absorb_fresh_neighbours(&mut self, list: ListId) -> bool;

    /// Moves every free block into the fresh list, coalescing where the strategy does (only
    /// after every stream was synchronized).
    fn merge_all_into_fresh(&mut self);

    /// Takes every free block that is a whole upstream chunk out of the lists and returns them.
    fn remove_free_chunks(&mut self) -> Vec<(usize, usize)>;

    /// Free bytes in all lists.
    fn free_bytes(&self) -> usize;

    /// Free blocks in all lists.
    fn free_blocks(&self) -> usize;

    /// The largest free block.
    fn largest_free_block(&self) -> usize;
}

/// How the core sizes its upstream requests.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Growth {
    /// The pool's policy: ask for `max(needed, pool size)` (doubling), capped by the room left to
    /// `maximum` and by the upstream's free memory (when known and enough for `needed`); on an
    /// upstream failure halve the request, down to `needed`.
    Geometric {
        /// The pool's maximum size, if any.
        maximum: Option<usize>,
    },
    /// The fixed-size policy: chunks of `chunk` bytes; on an upstream failure halve (in whole
    /// blocks) down to one `block`.
    Chunks {
        /// Bytes per chunk.
        chunk: usize,
        /// Bytes per block.
        block: usize,
    },
}

/// The generic stream-ordered suballocator: a strategy `F`, an upstream, and stream events.
pub(crate) struct StreamOrderedCore<F: FreeList> {
    upstream: SharedResource,
    events: Arc<dyn StreamEvents>,
    growth: Growth,
    name: &'static str,
    state: Mutex<CoreState<F>>,
}

impl<F: FreeList> std::fmt::Debug for StreamOrderedCore<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamOrderedCore")
            .field("name", &self.name)
            .field("upstream", &self.upstream.name())
            .field("growth", &self.growth)
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

/// Event bookkeeping of a per-thread default stream's list (see "Per-thread default streams").
#[derive(Clone, Copy, Debug, Default)]
struct ListMarks {
    /// Memory was freed into the list since its event was last recorded.
    unrecorded: bool,
    /// Another thread wanted memory from the list but could not record on its stream.
    wanted: bool,
}

struct CoreState<F> {
    free_list: F,
    /// The list of each stream.
    lists: AddressMap<StreamKey, ListId>,
    /// The stream of each list (index = list id; `None` for the fresh list).
    owners: Vec<Option<StreamKey>>,
    /// Event state of each list (index = list id); used for per-thread default streams.
    marks: Vec<ListMarks>,
    /// The last stream looked up, to skip the map on runs of one stream.
    last: Option<(StreamKey, ListId)>,
    /// Upstream chunks: address -> size.
    chunks: BTreeMap<usize, usize>,
    pool_size: usize,
}

impl<F: FreeList> CoreState<F> {
    /// Moves every free block to the fresh list (after a synchronisation of every stream).
    fn merge_all(&mut self) {
        self.free_list.merge_all_into_fresh();
        self.marks.fill(ListMarks::default());
    }

    #[inline]
    fn list_of(&mut self, key: StreamKey) -> ListId {
        if let Some((k, id)) = self.last {
            if k == key {
                return id;
            }
        }
        let id = match self.lists.get(&key) {
            Some(&id) => id,
            None => {
                let id = self.free_list.add_list();
                debug_assert_eq!(id as usize, self.owners.len());
                self.owners.push(Some(key));
                self.marks.push(ListMarks::default());
                self.lists.insert(key, id);
                id
            }
        };
        self.last = Some((key, id));
        id
    }
}

/// Which default events to use over `upstream`.
pub(crate) fn default_events(upstream: &SharedResource) -> Arc<dyn StreamEvents> {
    use super::stream_events::{CudaStreamEvents, NoStreamEvents};
    match upstream.kind() {
        crate::resource::MemoryKind::Simulated => Arc::new(NoStreamEvents),
        _ => Arc::new(CudaStreamEvents::new(upstream.device())),
    }
}

impl<F: FreeList> StreamOrderedCore<F> {
    /// A core with no memory yet.
    pub(crate) fn new(
        upstream: SharedResource,
        events: Arc<dyn StreamEvents>,
        growth: Growth,
        free_list: F,
        name: &'static str,
    ) -> Self {
        StreamOrderedCore {
            upstream,
            events,
            growth,
            name,
            state: Mutex::new(CoreState {
                free_list,
                lists: AddressMap::default(),
                owners: vec![None],
                marks: vec![ListMarks::default()],
                last: None,
                chunks: BTreeMap::new(),
                pool_size: 0,
            }),
        }
    }

    /// The upstream resource.
    pub(crate) fn upstream(&self) -> &SharedResource {
        &self.upstream
    }

    /// Adds exactly `bytes` from the upstream to the fresh list (construction).
    pub(crate) fn preallocate(&self, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let addr = self.upstream.allocate(bytes, Stream::DEFAULT)?;
        let mut st = self.state.lock();
        st.chunks.insert(addr, bytes);
        st.pool_size += bytes;
        st.free_list.add_chunk(addr, bytes);
        Ok(())
    }

    /// Allocates `bytes` on `stream`; see the module docs for the order of the searches.
    pub(crate) fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        if bytes == 0 {
            return Ok(0);
        }
        let key = StreamKey::of(stream);
        let mut st = self.state.lock();
        let size = st.free_list.block_size_for(bytes)?;
        let list = st.list_of(key);
        if key.is_per_thread() {
            self.record_if_wanted(&mut st, key, list)?;
        }
        if let Some(p) = st.free_list.take(list, size) {
            return Ok(p);
        }
        if let Some(p) = self.take_elsewhere(&mut st, key, list, size)? {
            return Ok(p);
        }
        if st.free_list.absorb_fresh_neighbours(list) {
            if let Some(p) = st.free_list.take(list, size) {
                return Ok(p);
            }
        }
        let grow_error = match self.grow(&mut st, bytes, size, stream) {
            Ok(()) => {
                if let Some(p) = st.free_list.take(FRESH, size) {
                    return Ok(p);
                }
                Error::out_of_memory(bytes, format!("{}: grown chunk too small", self.name))
            }
            Err(e) if e.is_out_of_memory() => e,
            Err(e) => return Err(e),
        };
        // Last resort: every stream synchronized, every list merged, free chunks given back.
        self.events.synchronize_all()?;
        st.merge_all();
        if let Some(p) = st.free_list.take(FRESH, size) {
            return Ok(p);
        }
        let could_fit = match self.growth {
            Growth::Geometric { maximum } => maximum.map_or(true, |m| size <= m),
            Growth::Chunks { .. } => true,
        };
        if could_fit && self.give_back_free_chunks(&mut st)? > 0 {
            self.grow(&mut st, bytes, size, stream)?;
            if let Some(p) = st.free_list.take(FRESH, size) {
                return Ok(p);
            }
        }
        Err(grow_error)
    }

    /// The fresh list, then another stream's list after the event wait.
    fn take_elsewhere(
        &self,
        st: &mut CoreState<F>,
        key: StreamKey,
        list: ListId,
        size: usize,
    ) -> Result<Option<usize>> {
        if let Some(p) = st.free_list.take(FRESH, size) {
            return Ok(Some(p));
        }
        for other in 1..st.owners.len() as ListId {
            if other == list || !st.free_list.can_take(other, size) {
                continue;
            }
            let Some(owner) = st.owners[other as usize] else {
                continue;
            };
            if !owner.is_reachable_here() {
                let marks = &mut st.marks[other as usize];
                if marks.unrecorded {
                    // Another thread's PTDS with frees after its last record: ask its owner to
                    // record, and look elsewhere meanwhile.
                    marks.wanted = true;
                    continue;
                }
            }
            self.events.make_wait(key, owner)?;
            if owner.is_reachable_here() {
                st.marks[other as usize].unrecorded = false;
            }
            return Ok(st.free_list.take(other, size));
        }
        Ok(None)
    }

    /// Adds a chunk of at least `size` bytes from the upstream to the fresh list.
    fn grow(&self, st: &mut CoreState<F>, bytes: usize, size: usize, stream: Stream) -> Result<()> {
        let (mut try_size, min_size, step) = match self.growth {
            Growth::Geometric { maximum } => {
                let room = maximum.map_or(usize::MAX, |m| m.saturating_sub(st.pool_size));
                if size > room {
                    return Err(Error::out_of_memory(
                        bytes,
                        format!(
                            "Maximum pool size exceeded: not enough room to grow, \
                             current/max/try size = {}, {}, {}",
                            st.pool_size,
                            maximum.unwrap_or(usize::MAX),
                            size
                        ),
                    ));
                }
                let mut t = size.max(st.pool_size).min(room);
                if let Some((free, _)) = self.upstream.memory_info() {
                    let free = free & !(ALLOCATION_ALIGNMENT - 1);
                    if free >= size {
                        t = t.min(free);
                    }
                }
                (t, size, ALLOCATION_ALIGNMENT)
            }
            Growth::Chunks { chunk, block } => (chunk.max(size), size.max(block), block),
        };
        loop {
            match self.upstream.allocate(try_size, stream) {
                Ok(addr) => {
                    st.chunks.insert(addr, try_size);
                    st.pool_size += try_size;
                    st.free_list.add_chunk(addr, try_size);
                    return Ok(());
                }
                Err(e) if e.is_out_of_memory() && try_size > min_size => {
                    try_size = ((try_size / 2) / step * step).max(min_size);
                }
                Err(e) if e.is_out_of_memory() => {
                    let text = e.to_string();
                    let inner = text
                        .strip_prefix("std::bad_alloc: out_of_memory: ")
                        .unwrap_or(&text);
                    let reason = match self.growth {
                        Growth::Geometric { .. } => {
                            format!("Maximum pool size exceeded: upstream: {inner}")
                        }
                        Growth::Chunks { .. } => format!("{}: upstream: {inner}", self.name),
                    };
                    return Err(Error::out_of_memory(bytes, reason));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Gives every fully free chunk back to the upstream; the bytes given back. The caller has
    /// synchronized and merged.
    fn give_back_free_chunks(&self, st: &mut CoreState<F>) -> Result<usize> {
        let mut released = 0;
        let mut first_error = None;
        for (addr, size) in st.free_list.remove_free_chunks() {
            st.chunks.remove(&addr);
            st.pool_size -= size;
            released += size;
            // SAFETY: `addr` is a chunk allocated from the upstream with `size`, removed from
            // the chunk table here so it is freed once; all lists were synchronized, so no
            // work is pending on it.
            #[allow(unsafe_code)]
            let freed = unsafe { self.upstream.deallocate(addr, size, Stream::DEFAULT) };
            if let Err(e) = freed {
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(released),
        }
    }

    /// Frees `ptr` on `stream` into that stream's list.
    pub(crate) fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        let key = StreamKey::of(stream);
        let mut st = self.state.lock();
        let list = st.list_of(key);
        // The strategies know each block's size; `bytes` is the caller's (unchecked) figure.
        st.free_list.give_back(list, ptr, bytes)?;
        if key.is_per_thread() {
            st.marks[list as usize].unrecorded = true;
            self.record_if_wanted(&mut st, key, list)?;
        }
        Ok(())
    }

    /// On the owner thread of a per-thread default stream's list: records the list's event if
    /// another thread asked for it and the list had frees since the last record.
    #[inline]
    fn record_if_wanted(&self, st: &mut CoreState<F>, key: StreamKey, list: ListId) -> Result<()> {
        let marks = &mut st.marks[list as usize];
        if marks.wanted && marks.unrecorded {
            self.events.record_after_free(key)?;
            *marks = ListMarks::default();
        }
        Ok(())
    }

    /// Synchronizes, merges, and gives every fully free upstream chunk back; bytes released.
    pub(crate) fn release(&self) -> Result<usize> {
        let mut st = self.state.lock();
        self.events.synchronize_all()?;
        st.merge_all();
        self.give_back_free_chunks(&mut st)
    }

    /// Bytes held from the upstream.
    pub(crate) fn pool_size(&self) -> usize {
        self.state.lock().pool_size
    }

    /// Number of upstream chunks held.
    pub(crate) fn chunk_count(&self) -> usize {
        self.state.lock().chunks.len()
    }

    /// Free bytes over all lists.
    pub(crate) fn free_bytes(&self) -> usize {
        self.state.lock().free_list.free_bytes()
    }

    /// Free blocks over all lists.
    pub(crate) fn free_blocks(&self) -> usize {
        self.state.lock().free_list.free_blocks()
    }

    /// Footprint: held bytes, free bytes, largest free block, free blocks.
    pub(crate) fn footprint(&self) -> Footprint {
        let st = self.state.lock();
        Footprint {
            held_bytes: st.pool_size,
            free_bytes: st.free_list.free_bytes(),
            largest_free_block: st.free_list.largest_free_block(),
            free_blocks: st.free_list.free_blocks(),
        }
    }
}

impl<F: FreeList> Drop for StreamOrderedCore<F> {
    fn drop(&mut self) {
        let _ = self.events.synchronize_all();
        let chunks = std::mem::take(&mut self.state.get_mut().chunks);
        for (addr, size) in chunks {
            // SAFETY: `addr` is a chunk allocated from the upstream with `size`, taken out of the
            // table so freed once; the core is being dropped after synchronizing its streams.
            #[allow(unsafe_code)]
            let _ = unsafe { self.upstream.deallocate(addr, size, Stream::DEFAULT) };
        }
    }
}
