//! `ManagedMemoryResource`: managed memory (`cuMemAllocManaged`) at pool speed while the data
//! fits, and past the device when it does not.
//!
//! # Where RMM's managed resource loses its time, and what this one does instead
//! RMM's `managed_memory_resource` calls `cudaMallocManaged` and `cudaFree` for every
//! allocation (each 10-30 µs, and `cudaFree` synchronizes the device), and every fresh range is
//! empty: the first kernel to touch it takes a page fault per 2 MiB page or less while the
//! driver makes its pages on the device (measured on an H100: 35 ms for a 256 MiB kernel on a
//! fresh range against 0.4 ms on a prefetched one). Harmony in rapids-singlecell allocates and
//! frees the same sizes thousands of times, so it paid both, over and over (6.2x a pool).
//!
//! This resource keeps what is freed for reuse and places what is new:
//! - **Reuse.** A freed range goes to a cache, by size class (at most 1/32 above the request,
//!   `free_lists/size_classes.rs`), on the stream it was freed on; a later request of that class on that
//!   stream takes it at once, already on the device and mapped, with no CUDA call. Another
//!   stream takes it after an event wait; the stream-ordered core does this as for the pool
//!   (`core/stream_ordered.rs`). Each range stays one `cuMemAllocManaged` allocation, whole: never
//!   split, never merged, so each can go back on its own.
//! - **Placement.** A fresh range of at least 2 MiB is prefetched to the device on the
//!   allocating stream while the device has room for it and 1/32 of its memory to spare (no
//!   page faults at first touch); the part that does not fit is advised to live in host memory,
//!   mapped for the device (preferred location CPU, accessed by the device), and its pages are
//!   made on the host at once from several threads: the device reads and writes it over the
//!   link at the link's speed and its pages do not migrate back and forth. The first-placed data
//!   stays on the device; what comes when the device is full stays on the host
//!   ([`placement`](crate::resource::placement_for)). Smaller ranges are left to the driver's
//!   first touch, as RMM leaves every range. Which layer places is a typed option
//!   ([`PlacementMode`]): this resource places its fresh ranges (`Ranges`, for direct use), or a
//!   suballocator over it places the blocks it hands out, not its chunks (`Blocks`, what the
//!   managed pool's plan sets), through the placer this resource's link carries.
//! - **Giving back.** The cache holds at most `cache_limit` bytes (default: a quarter of the
//!   device's memory); a free that passes the limit gives ranges back (synchronizing the device
//!   first, as `cudaFree` does) down to half the limit. When an allocation of device or managed
//!   memory anywhere in the process fails for want of memory (`cuMemAlloc`, `cuMemAllocManaged`,
//!   `cuMemAllocAsync`, through any rrmm resource on that device), every managed cache of the
//!   device gives back all it keeps and the allocation is tried again ([`crate::pressure`]);
//!   its own growth failing does the same. [`ManagedMemoryResource::release`] gives everything
//!   back on demand. Managed pages in the cache are also evictable by the driver like any
//!   managed memory, so other managed allocations push them to the host, not out of memory.
//!
//! `cache_limit = 0` and `placement = false` give RMM's behaviour exactly (every free a
//! `cuMemFree`). Frees are checked as the pool's are (a bogus, double or wrong-size free is
//! [`Error::Logic`](crate::Error::Logic)).
//!

use super::core::{
    checked_chunk, default_events, Block, FreeList, GrowRequest, Growth, Keeps, StreamOrderedCore,
};
use super::free_lists::WholeBlockFreeList;
use crate::cuda::Stream;
use crate::error::Result;
use crate::pressure::Relieve;
use crate::report::PoolReport;
use crate::resource::{
    BlockPlacer, CallProfile, DevicePlacement, MemoryResource, PlacementMode, SharedResource,
    UncachedManagedMemoryResource,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The default cache limit: this fraction of the device's memory (a quarter).
pub const DEFAULT_CACHE_DIVISOR: usize = 4;

/// How a [`ManagedMemoryResource`] caches and places; the default caches a quarter of the
/// device's memory and places fresh ranges ([`PlacementMode::Ranges`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ManagedOptions {
    /// The most bytes kept free for reuse; `None`: a quarter of the device's memory; 0: none
    /// (every free is a `cuMemFree`).
    pub cache_limit: Option<usize>,
    /// Who places fresh memory (prefetched to the device while it has room, the rest kept in
    /// host memory, made there and mapped for the device): nobody, this resource's ranges, or
    /// the blocks a suballocator over it hands out.
    pub placement: PlacementMode,
}

/// Managed memory with a reuse cache and placement of fresh ranges (see the module's docs).
/// Cheap to clone: clones share the cache; the memory goes back when the last one drops.
#[derive(Clone, Debug)]
pub struct ManagedMemoryResource {
    inner: Arc<Inner>,
}

struct Inner {
    core: StreamOrderedCore<WholeBlockFreeList>,
    source: SharedResource,
    cache_limit: usize,
    /// The placer, when anything is placed.
    placer: Option<Arc<BlockPlacer>>,
    /// Who places.
    mode: PlacementMode,
    /// Bytes of the blocks handed out and not freed (class sizes).
    live: AtomicUsize,
    /// Bytes held from the source (live and cached).
    held: Arc<AtomicUsize>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedMemoryResource")
            .field("source", &self.source)
            .field("cache_limit", &self.cache_limit)
            .field("placement", &self.placer.is_some())
            .field("live", &self.live)
            .field("held", &self.held)
            .finish_non_exhaustive()
    }
}

/// One source allocation per block; fresh ranges placed on the request's stream.
struct PerRange {
    source: SharedResource,
    /// Places each fresh range, when this resource places its ranges.
    place_ranges: Option<Arc<BlockPlacer>>,
    /// Forgets the granules of a range given back, when anything is placed.
    placer: Option<Arc<BlockPlacer>>,
    held: Arc<AtomicUsize>,
}

impl std::fmt::Debug for PerRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerRange")
            .field("source", &self.source)
            .field("placer", &self.placer.is_some())
            .finish_non_exhaustive()
    }
}

impl Growth for PerRange {
    fn upstream(&self) -> Option<&SharedResource> {
        Some(&self.source)
    }

    fn grow(&self, request: GrowRequest) -> Result<Block> {
        let addr = self.source.allocate(request.size, request.stream)?;
        let block = checked_chunk(&self.source, addr, request.size, request.stream)?;
        if let Some(placer) = &self.place_ranges {
            placer.place(addr, request.bytes.min(request.size), request.stream);
        }
        self.held.fetch_add(block.size, Ordering::Relaxed);
        Ok(block)
    }

    #[allow(unsafe_code)]
    unsafe fn give_back(&self, chunk: Block) -> Result<()> {
        // SAFETY: the trait's contract: the chunk came from `grow` (the source's allocate with
        // this size), is given back once, and every stream was synchronized after its last use.
        unsafe {
            self.source
                .deallocate(chunk.addr, chunk.size, Stream::DEFAULT)
        }?;
        if let Some(placer) = &self.placer {
            placer.forget(chunk.addr, chunk.size);
        }
        self.held.fetch_sub(chunk.size, Ordering::Relaxed);
        Ok(())
    }
}

impl ManagedMemoryResource {
    /// Managed memory of the current device with the default options.
    ///
    /// # Errors
    /// [`Error::NoDriver`](crate::Error::NoDriver) where there is no CUDA driver.
    pub fn new() -> Result<Self> {
        Self::with_options(ManagedOptions::default())
    }

    /// Managed memory of the current device with `options`.
    ///
    /// # Errors
    /// As [`ManagedMemoryResource::new`].
    pub fn with_options(options: ManagedOptions) -> Result<Self> {
        Self::on_device(crate::cuda::current_device()?, options)
    }

    /// Managed memory of device `ordinal` with `options`.
    ///
    /// # Errors
    /// No driver, or a bad ordinal.
    pub fn on_device(ordinal: usize, options: ManagedOptions) -> Result<Self> {
        let managed = Arc::new(UncachedManagedMemoryResource::on_device(ordinal)?);
        let mode = if crate::cuda::concurrent_managed_access(ordinal) {
            options.placement
        } else {
            PlacementMode::Off
        };
        let source: SharedResource = managed;
        let placer = (mode != PlacementMode::Off)
            .then(|| Arc::new(BlockPlacer::new(Box::new(DevicePlacement::new(ordinal)))));
        Ok(Self::build(source, options.cache_limit, placer, mode))
    }

    /// The cache over any `source` of memory (a simulated device stands in for managed memory
    /// in tests and replays); fresh ranges are not placed.
    pub fn over(source: SharedResource, cache_limit: Option<usize>) -> Self {
        Self::build(source, cache_limit, None, PlacementMode::Off)
    }

    fn build(
        source: SharedResource,
        cache_limit: Option<usize>,
        placer: Option<Arc<BlockPlacer>>,
        mode: PlacementMode,
    ) -> Self {
        let cache_limit = cache_limit.unwrap_or_else(|| {
            source
                .memory_info()
                .map_or(0, |(_, total)| total / DEFAULT_CACHE_DIVISOR)
        });
        let held = Arc::new(AtomicUsize::new(0));
        let inner = Arc::new_cyclic(|me: &std::sync::Weak<Inner>| Inner {
            core: StreamOrderedCore::new(
                default_events(&source),
                Box::new(PerRange {
                    source: source.clone(),
                    place_ranges: placer.clone().filter(|_| mode == PlacementMode::Ranges),
                    placer: placer.clone(),
                    held: held.clone(),
                }),
                (),
                "managed",
                Keeps::Relievable(me.clone()),
            ),
            source,
            cache_limit,
            placer,
            mode,
            live: AtomicUsize::new(0),
            held,
        });
        ManagedMemoryResource { inner }
    }

    /// Gives every cached range back (after synchronizing the device); the bytes given back.
    ///
    /// # Errors
    /// CUDA errors of the synchronization or of `cuMemFree`.
    pub fn release(&self) -> Result<usize> {
        self.inner.core.release(0)
    }

    /// Bytes kept free for reuse now.
    pub fn cached_bytes(&self) -> usize {
        self.inner.cached()
    }

    /// Bytes held from the source (handed out and cached).
    pub fn held_bytes(&self) -> usize {
        self.inner.held.load(Ordering::Relaxed)
    }

    /// The most bytes kept free for reuse.
    pub fn cache_limit(&self) -> usize {
        self.inner.cache_limit
    }

    /// Whether fresh ranges are placed (prefetched or advised).
    pub fn placement(&self) -> bool {
        self.inner.placer.is_some()
    }

    /// Bytes placed so far: prefetched to the device, and made in host memory mapped for the
    /// device (zero for both when placement is off).
    pub fn placed_bytes(&self) -> crate::resource::Placement {
        self.inner
            .placer
            .as_ref()
            .map_or_else(Default::default, |p| p.totals())
    }

    /// The source of the ranges (`cuMemAllocManaged`, or what [`Self::over`] was given).
    pub fn source(&self) -> &SharedResource {
        &self.inner.source
    }
}

impl Inner {
    fn cached(&self) -> usize {
        self.held
            .load(Ordering::Relaxed)
            .saturating_sub(self.live.load(Ordering::Relaxed))
    }
}

impl Relieve for Inner {
    fn relieve(&self) -> usize {
        let keep = self.live.load(Ordering::Relaxed);
        self.core.try_release_to(keep).unwrap_or(0)
    }

    fn cached(&self) -> usize {
        Inner::cached(self)
    }
}

impl MemoryResource for ManagedMemoryResource {
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        let ptr = self.inner.core.allocate(bytes, stream)?;
        if bytes > 0 {
            let size = WholeBlockFreeList::block_size_for(&(), bytes)?;
            self.inner.live.fetch_add(size, Ordering::Relaxed);
        }
        Ok(ptr)
    }

    /// Checked (as the pool's frees): only the stream-ordering part of the contract applies.
    /// A free that takes the cache past its limit gives ranges back down to half of it.
    #[allow(unsafe_code)]
    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        let inner = &self.inner;
        inner.core.deallocate(ptr, bytes, stream)?;
        if ptr == 0 {
            return Ok(());
        }
        let size = WholeBlockFreeList::block_size_for(&(), bytes)?;
        let live = inner.live.fetch_sub(size, Ordering::Relaxed) - size;
        if inner.cached() > inner.cache_limit {
            // Not waiting for a lock another thread holds (it is growing or releasing: the
            // next free checks again).
            inner.core.try_release_to(live + inner.cache_limit / 2)?;
        }
        Ok(())
    }

    crate::resource::memory_from!(|this| this.inner.core);

    /// The device's free and total memory (`cuMemGetInfo`), as RMM's managed resource reports.
    fn memory_info(&self) -> Option<(usize, usize)> {
        self.inner.source.memory_info()
    }

    fn report(&self) -> Option<&dyn PoolReport> {
        Some(&self.inner.core)
    }

    /// A source of managed memory; with [`PlacementMode::Blocks`] its link carries the placer
    /// for the suballocator over it. Its calls block: a cache miss allocates (and prefetches) a
    /// fresh managed range in the driver, which is the common call for data that does not
    /// repeat its sizes.
    fn link(&self) -> crate::resource::Link {
        let calls = self.inner.core.call_profile().and(CallProfile::BLOCKING);
        let mut link =
            crate::resource::Link::source(self.kind(), self.device(), self.identity(), calls);
        if self.inner.mode == PlacementMode::Blocks {
            link.placement = self.inner.placer.clone();
        }
        link
    }

    fn upstreams(&self) -> Vec<SharedResource> {
        Vec::new()
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn name(&self) -> &'static str {
        "managed"
    }

    fn identity(&self) -> usize {
        Arc::as_ptr(&self.inner) as *const () as usize
    }
}

#[cfg(test)]
#[allow(unsafe_code)]
mod tests {
    use super::*;
    use crate::resource::SimulatedMemoryResource;
    use crate::test_support::free;

    const MIB: usize = 1 << 20;

    /// A placement that records what it was asked to place.
    #[derive(Debug, Default)]
    struct Recorder(parking_lot::Mutex<Vec<(usize, usize)>>);

    impl crate::resource::PlaceRange for Arc<Recorder> {
        fn place(
            &self,
            addr: usize,
            bytes: usize,
            _stream: Stream,
        ) -> Option<crate::resource::Placement> {
            self.0.lock().push((addr, bytes));
            Some(crate::resource::Placement {
                device: bytes,
                host: 0,
            })
        }
    }

    /// Issue 36: who places is the managed layer's typed option, and building a pool over it
    /// changes nothing for its other users (it used to stop placing, for everyone, once any
    /// pool had been built over it). With `Ranges` the resource places its fresh ranges (the
    /// pool's chunk included) before and after a pool exists; with `Blocks` it places none of
    /// its own and the pool places the blocks it hands out, through its link.
    #[test]
    fn placement_is_the_layers_option_not_a_side_effect() {
        use crate::suballocator::PoolMemoryResource;
        for mode in [PlacementMode::Ranges, PlacementMode::Blocks] {
            let rec = Arc::new(Recorder::default());
            let placer = Arc::new(BlockPlacer::new(Box::new(rec.clone())));
            let sim: SharedResource = Arc::new(SimulatedMemoryResource::new(1 << 30));
            let managed = ManagedMemoryResource::build(sim, Some(0), Some(placer), mode);
            let direct = managed.allocate(4 * MIB, Stream::DEFAULT).unwrap();
            let pool =
                PoolMemoryResource::new(Arc::new(managed.clone()), Some(16 * MIB), None).unwrap();
            let after = managed.allocate(6 * MIB, Stream::DEFAULT).unwrap();
            let block = pool.allocate(4 * MIB, Stream::DEFAULT).unwrap();
            let placed: Vec<usize> = rec.0.lock().iter().map(|&(a, _)| a).collect();
            match mode {
                PlacementMode::Ranges => {
                    assert!(
                        placed.contains(&direct) && placed.contains(&after),
                        "{placed:?}"
                    );
                    assert_eq!(pool.placed_bytes(), None, "the pool places nothing itself");
                }
                _ => {
                    assert_eq!(placed, vec![block], "only the pool's block");
                    assert_eq!(pool.placed_bytes().unwrap().device, 4 * MIB);
                }
            }
            free(&pool, block, 4 * MIB).unwrap();
            free(&managed, after, 6 * MIB).unwrap();
            free(&managed, direct, 4 * MIB).unwrap();
        }
    }

    fn over_sim(
        device: usize,
        limit: Option<usize>,
    ) -> (Arc<SimulatedMemoryResource>, ManagedMemoryResource) {
        let sim = Arc::new(SimulatedMemoryResource::new(device));
        let cache = ManagedMemoryResource::over(sim.clone(), limit);
        (sim, cache)
    }

    #[test]
    fn a_freed_range_is_reused_by_a_request_of_its_class_without_the_source() {
        let (sim, cache) = over_sim(64 * MIB, None);
        assert_eq!(cache.cache_limit(), 16 * MIB, "a quarter of the device");
        let a = cache.allocate(3 * MIB, Stream::DEFAULT).unwrap();
        assert_eq!((cache.held_bytes(), cache.cached_bytes()), (3 * MIB, 0));
        free(&cache, a, 3 * MIB).unwrap();
        assert_eq!(cache.cached_bytes(), 3 * MIB);
        assert_eq!(sim.bytes_in_use(), 4 * MIB, "kept (2 MiB pages)");
        // The same class (up to 1/32 above) takes the same range.
        let b = cache.allocate(3 * MIB - 1000, Stream::DEFAULT).unwrap();
        assert_eq!(b, a);
        assert_eq!(cache.cached_bytes(), 0);
        // Another class is a new range.
        let c = cache.allocate(MIB, Stream::DEFAULT).unwrap();
        assert_ne!(c, a);
        // A free of another class's size, a double free and a bogus free are logic errors.
        assert!(matches!(free(&cache, b, MIB), Err(crate::Error::Logic(_))));
        free(&cache, b, 3 * MIB).unwrap();
        assert!(matches!(
            free(&cache, b, 3 * MIB),
            Err(crate::Error::Logic(_))
        ));
        assert!(matches!(
            free(&cache, 0x1234_0000, 256),
            Err(crate::Error::Logic(_))
        ));
        free(&cache, c, MIB).unwrap();
        assert_eq!(cache.release().unwrap(), 4 * MIB);
        assert_eq!((cache.held_bytes(), sim.bytes_in_use()), (0, 0));
    }

    #[test]
    fn the_cache_gives_back_past_its_limit_down_to_half_of_it() {
        let (sim, cache) = over_sim(64 * MIB, Some(8 * MIB));
        let blocks: Vec<usize> = (0..6)
            .map(|_| cache.allocate(2 * MIB, Stream::DEFAULT).unwrap())
            .collect();
        for &p in &blocks[..4] {
            free(&cache, p, 2 * MIB).unwrap();
        }
        assert_eq!(cache.cached_bytes(), 8 * MIB, "at the limit: all kept");
        free(&cache, blocks[4], 2 * MIB).unwrap();
        assert!(cache.cached_bytes() <= 4 * MIB, "past it: down to half");
        assert_eq!(sim.bytes_in_use(), cache.held_bytes());
        free(&cache, blocks[5], 2 * MIB).unwrap();
        // No cache at all: every free goes back.
        let (sim, none) = over_sim(64 * MIB, Some(0));
        let p = none.allocate(MIB, Stream::DEFAULT).unwrap();
        free(&none, p, MIB).unwrap();
        assert_eq!((none.cached_bytes(), sim.bytes_in_use()), (0, 0));
    }

    #[test]
    fn another_allocation_out_of_memory_on_the_device_takes_the_cache_back() {
        let (sim, cache) = over_sim(16 * MIB, None);
        let p = cache.allocate(4 * MIB, Stream::DEFAULT).unwrap();
        free(&cache, p, 4 * MIB).unwrap();
        assert_eq!(cache.cached_bytes(), 4 * MIB);
        // 14 MiB directly from the device: 4 of them are in the cache; the device's failure
        // relieves it and succeeds on the second try.
        let q = sim.allocate(14 * MIB, Stream::DEFAULT).unwrap();
        assert_eq!(cache.cached_bytes(), 0);
        free(sim.as_ref(), q, 14 * MIB).unwrap();
        // The cache's own growth failing gives its own ranges back (the core's last resort).
        let a = cache.allocate(8 * MIB, Stream::DEFAULT).unwrap();
        free(&cache, a, 8 * MIB).unwrap();
        let b = cache.allocate(12 * MIB, Stream::DEFAULT).unwrap();
        assert_eq!(cache.held_bytes(), 12 * MIB);
        free(&cache, b, 12 * MIB).unwrap();
    }
}
