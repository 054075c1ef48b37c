//! `PoolMemoryResource`: a coalescing, stream-ordered pool that grows from its upstream.

use super::core::{
    default_events, forward_memory_resource, Geometric, Keeps, StreamEvents, StreamOrderedCore,
};
use super::free_lists::CoalescingFreeList;
use crate::error::{Error, Result};
use crate::resource::{SharedResource, ALLOCATION_ALIGNMENT};
use std::sync::Arc;

/// A coalescing good-fit suballocator over memory taken from an upstream resource, with RMM's
/// `pool_memory_resource` semantics and O(1) allocate and free (see the coalescing free list).
///
/// Stream-ordered: memory freed on a stream is reused on that stream at once, and on another
/// stream only after an event wait. Cheap to clone (clones share the pool); the memory goes back
/// to the upstream when the last clone drops.
///
/// # Growth policy
/// When no free block fits, the pool asks the upstream for `max(request, pool size)` (so it
/// doubles), capped by the room left to the maximum and by the upstream's free memory (when the
/// upstream reports it and it covers the request; when it reports less, the pool asks for the
/// request alone); when the upstream fails, it asks for a little less, then less (a margin that
/// doubles), down to the request (RMM halves, which near a full device leaves a tail in each
/// halved chunk that later requests cannot use). So the pool
/// never asks for more than the maximum allows (RMM's overshoot failures), and a request that
/// fits the room left never fails for want of a round number.
/// Before reporting out of memory, it synchronizes, merges every stream's free blocks, retries,
/// and gives the fully free chunks it grew back to grow one chunk large enough (the initial
/// chunk stays: a failed request never shrinks the pool below its initial size); a failure with
/// nothing freed, grown or released since the last one skips these steps (they would find
/// nothing) and only asks the upstream again.
///
/// A free must give the allocation's size (up to the 256-byte rounding): a pointer the pool did
/// not hand out, a double free, or another size is [`Error::Logic`] and changes nothing.
#[derive(Clone, Debug)]
pub struct PoolMemoryResource {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    core: StreamOrderedCore<CoalescingFreeList>,
    maximum_pool_size: Option<usize>,
    /// The upstream (its growth policy's source, shared).
    upstream: SharedResource,
}

super::core::relieve_by_core!(Inner);

/// RMM's checks of a pool's sizes, for every pool (the pool, the expandable pool) and for a
/// stack's plan before anything is built: each a multiple of 256 bytes, the initial at most the
/// maximum. RMM's words start each message; the value given and the fix follow.
///
/// # Errors
/// [`Error::Logic`] (RMM's `logic_error`) saying which size and why.
pub fn check_pool_sizes(initial: Option<usize>, maximum: Option<usize>) -> Result<()> {
    for (rmm_name, name, size) in [
        ("Initial", "initial_pool_size", initial),
        ("Maximum", "maximum_pool_size", maximum),
    ] {
        let Some(size) = size.filter(|s| s % ALLOCATION_ALIGNMENT != 0) else {
            continue;
        };
        let down = size - size % ALLOCATION_ALIGNMENT;
        let up = down.checked_add(ALLOCATION_ALIGNMENT);
        let fix = match (down, up) {
            (0, Some(up)) => format!("use {up}"),
            (down, Some(up)) => format!("use {down} or {up}"),
            (down, None) => format!("use {down}"),
        };
        return Err(Error::Logic(format!(
            "Error, {rmm_name} pool size required to be a multiple of 256 bytes \
             ({name}={size}: {fix})"
        )));
    }
    if let (Some(initial), Some(maximum)) = (initial, maximum) {
        if initial > maximum {
            return Err(Error::Logic(format!(
                "Initial pool size exceeds the maximum pool size! (initial_pool_size={initial} \
                 > maximum_pool_size={maximum}: lower the initial size or raise the maximum)"
            )));
        }
    }
    Ok(())
}

impl PoolMemoryResource {
    /// A pool over `upstream` holding `initial_pool_size` bytes (default: half the upstream's
    /// free memory from [`MemoryResource::memory_info`](crate::MemoryResource::memory_info), rounded down to 256 and at most the
    /// maximum; 0 when the upstream does not report it) and growing up to
    /// `maximum_pool_size` (default: no limit but the upstream's).
    ///
    /// # Errors
    /// [`Error::Logic`] with RMM's messages when a size is not a multiple of 256 or the initial
    /// size exceeds the maximum; the upstream's error when the initial allocation fails.
    pub fn new(
        upstream: SharedResource,
        initial_pool_size: Option<usize>,
        maximum_pool_size: Option<usize>,
    ) -> Result<Self> {
        let events = default_events(&upstream);
        Self::with_events(upstream, initial_pool_size, maximum_pool_size, events)
    }

    /// As [`PoolMemoryResource::new`], with an explicit cross-stream ordering implementation
    /// (tests use a recording fake).
    ///
    /// # Errors
    /// As [`PoolMemoryResource::new`].
    pub fn with_events(
        upstream: SharedResource,
        initial_pool_size: Option<usize>,
        maximum_pool_size: Option<usize>,
        events: Arc<dyn StreamEvents>,
    ) -> Result<Self> {
        check_pool_sizes(initial_pool_size, maximum_pool_size)?;
        let initial = match initial_pool_size {
            Some(size) => size,
            None => {
                let half = upstream.memory_info().map_or(0, |(free, _)| free / 2);
                (half & !(ALLOCATION_ALIGNMENT - 1)).min(maximum_pool_size.unwrap_or(usize::MAX))
            }
        };
        let source = upstream.clone();
        let inner = Arc::new_cyclic(|me: &std::sync::Weak<Inner>| Inner {
            core: StreamOrderedCore::new(
                events,
                Box::new(Geometric {
                    upstream,
                    maximum: maximum_pool_size,
                }),
                (),
                "pool",
                Keeps::Relievable(me.clone()),
            ),
            upstream: source,
            maximum_pool_size,
        });
        inner.core.preallocate(initial)?;
        Ok(PoolMemoryResource { inner })
    }

    /// Bytes placed by the blocks of the managed memory below (prefetched to the device, made
    /// in host memory mapped for the device) when that memory is placed by blocks
    /// ([`PlacementMode::Blocks`](crate::resource::PlacementMode::Blocks)); `None` otherwise.
    pub fn placed_bytes(&self) -> Option<crate::resource::Placement> {
        use crate::resource::MemoryResource;
        self.inner.core.link().placement.map(|p| p.totals())
    }

    /// Bytes held from the upstream, free and allocated.
    pub fn pool_size(&self) -> usize {
        self.inner.core.pool_size()
    }

    /// The maximum pool size, if one was set.
    pub fn maximum_pool_size(&self) -> Option<usize> {
        self.inner.maximum_pool_size
    }

    /// Gives every fully free upstream chunk back to the upstream (after synchronizing every
    /// stream and merging the free lists) and returns the bytes released.
    ///
    /// # Errors
    /// CUDA errors from the synchronisation or the upstream's deallocation.
    ///
    /// # Time Complexity
    /// O(free blocks).
    pub fn release(&self) -> Result<usize> {
        self.inner.core.release(0)
    }

    super::core::free_figures!("held from the upstream");

    /// Number of chunks currently held from the upstream.
    pub fn upstream_chunk_count(&self) -> usize {
        self.inner.core.chunk_count()
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &SharedResource {
        &self.inner.upstream
    }
}

// Free: the pool's free bytes plus what it could still grow by; total: the upstream's total,
// capped by the maximum (the `Geometric` growth policy's figures).
forward_memory_resource!(PoolMemoryResource, |this| &this.inner.core);

#[cfg(test)]
// Tests call the unsafe `deallocate` and make fake stream keys, each with its SAFETY line.
#[allow(unsafe_code)]
mod tests {
    use super::*;
    use crate::cuda::Stream;
    use crate::resource::{MemoryKind, MemoryResource, SimulatedMemoryResource};
    use crate::test_support::free_on;

    fn sim(size: usize) -> SharedResource {
        Arc::new(SimulatedMemoryResource::new(size))
    }

    #[test]
    fn default_initial_size_is_half_the_free_memory() {
        let pool = PoolMemoryResource::new(sim(1 << 20), None, None).unwrap();
        assert_eq!(pool.pool_size(), 1 << 19);
        let capped = PoolMemoryResource::new(sim(1 << 20), None, Some(4096)).unwrap();
        assert_eq!(capped.pool_size(), 4096);
        assert_eq!(pool.name(), "pool");
        assert_eq!(pool.kind(), MemoryKind::Simulated);
    }

    #[test]
    fn size_validation_uses_rmm_messages() {
        let msg = |r: Result<PoolMemoryResource>| r.unwrap_err().to_string();
        assert_eq!(
            msg(PoolMemoryResource::new(sim(1 << 20), Some(100), None)),
            "Error, Initial pool size required to be a multiple of 256 bytes \
             (initial_pool_size=100: use 256)"
        );
        assert_eq!(
            msg(PoolMemoryResource::new(sim(1 << 20), Some(256), Some(1000))),
            "Error, Maximum pool size required to be a multiple of 256 bytes \
             (maximum_pool_size=1000: use 768 or 1024)"
        );
        let e = PoolMemoryResource::new(sim(1 << 20), Some(2048), Some(1024)).unwrap_err();
        assert!(matches!(e, Error::Logic(_)));
        assert!(e.to_string().starts_with(
            "Initial pool size exceeds the maximum pool size! (initial_pool_size=2048"
        ));
        // The largest size that is no multiple of 256 has no multiple above it.
        assert!(msg(PoolMemoryResource::new(
            sim(1 << 20),
            Some(usize::MAX),
            None
        ))
        .ends_with(&format!("use {})", usize::MAX - 255)));
        assert!(PoolMemoryResource::new(sim(1024), Some(4096), None)
            .unwrap_err()
            .is_out_of_memory());
    }

    #[test]
    fn out_of_memory_at_the_maximum_then_the_pool_still_works() {
        let pool = PoolMemoryResource::new(sim(1 << 24), Some(0), Some(1 << 20)).unwrap();
        let a = pool.allocate(600 << 10, Stream::DEFAULT).unwrap();
        let e = pool.allocate(600 << 10, Stream::DEFAULT).unwrap_err();
        assert!(e.is_out_of_memory());
        let text = e.to_string();
        assert!(text.contains("Maximum pool size exceeded"), "{text}");
        assert!(text.contains(&(600usize << 10).to_string()), "{text}");
        assert!(text.contains(&(1usize << 20).to_string()), "{text}");
        assert!(pool.pool_size() <= 1 << 20);
        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
        unsafe { pool.deallocate(a, 600 << 10, Stream::DEFAULT) }.unwrap();
        let b = pool.allocate(1 << 20, Stream::DEFAULT).unwrap();
        assert_eq!(pool.pool_size(), 1 << 20);
        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
        unsafe { pool.deallocate(b, 1 << 20, Stream::DEFAULT) }.unwrap();
    }

    #[test]
    fn frees_leave_fresh_memory_fresh_until_the_stream_needs_it() {
        // SAFETY: a key only: simulated memory never passes it to the driver.
        for stream in [Stream::PER_THREAD, unsafe { Stream::from_raw(0x1000) }] {
            let pool = PoolMemoryResource::new(sim(1 << 20), Some(8192), None).unwrap();
            let p = pool.allocate(4096, stream).unwrap();
            // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
            unsafe { pool.deallocate(p, 4096, stream) }.unwrap();
            assert_eq!(
                pool.report()
                    .unwrap()
                    .stream_free(stream)
                    .unwrap()
                    .this_stream,
                4096,
                "{stream:?}: fresh tail kept apart"
            );
            // The figures count the freed block and the fresh tail beside it as one region.
            assert_eq!(pool.free_block_count(), 1);
            assert_eq!(pool.largest_free_block(), 8192);
            // Needing both, the stream takes the fresh block beside its own: no growth.
            let q = pool.allocate(8192, stream).unwrap();
            assert_eq!((q, pool.pool_size()), (p, 8192));
            // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
            unsafe { pool.deallocate(q, 8192, stream) }.unwrap();
            assert_eq!(pool.free_block_count(), 1);
            assert_eq!(pool.release().unwrap(), 8192);
        }
    }

    #[test]
    fn a_request_above_the_maximum_keeps_the_pool() {
        let pool = PoolMemoryResource::new(sim(1 << 24), Some(4096), Some(1 << 20)).unwrap();
        assert!(pool
            .allocate(2 << 20, Stream::DEFAULT)
            .unwrap_err()
            .is_out_of_memory());
        assert_eq!(
            pool.pool_size(),
            4096,
            "free chunks kept: releasing could not help"
        );
    }

    #[test]
    fn a_failed_request_keeps_the_initial_chunk_and_gives_back_grown_ones() {
        // Issue 9: an idle pool gave its whole initial chunk back after one failed request.
        let up = Arc::new(SimulatedMemoryResource::new(1 << 20));
        let pool = PoolMemoryResource::new(up.clone(), Some(256 << 10), None).unwrap();
        let e = pool.allocate(2 << 20, Stream::DEFAULT).unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
        assert_eq!(pool.pool_size(), 256 << 10, "initial chunk kept");
        assert_eq!(up.bytes_in_use(), 256 << 10);
        // A grown chunk, free again, is given back to make room for a larger one.
        let a = pool.allocate(256 << 10, Stream::DEFAULT).unwrap();
        let b = pool.allocate(256 << 10, Stream::DEFAULT).unwrap();
        assert_eq!(pool.upstream_chunk_count(), 2);
        free_on(&pool, b, 256 << 10, Stream::DEFAULT).unwrap();
        let c = pool.allocate(700 << 10, Stream::DEFAULT).unwrap();
        assert_eq!(pool.pool_size(), (256 << 10) + (700 << 10));
        for (p, n) in [(a, 256 << 10), (c, 700 << 10)] {
            free_on(&pool, p, n, Stream::DEFAULT).unwrap();
        }
        // release() gives back everything, the initial chunk included.
        assert_eq!(pool.release().unwrap(), (256 << 10) + (700 << 10));
        assert_eq!(up.bytes_in_use(), 0);
    }

    #[test]
    fn growth_doubles_and_release_returns_free_chunks() {
        let up = Arc::new(SimulatedMemoryResource::new(1 << 24));
        let pool = PoolMemoryResource::new(up.clone(), Some(4096), None).unwrap();
        let a = pool.allocate(4096, Stream::DEFAULT).unwrap();
        let b = pool.allocate(256, Stream::DEFAULT).unwrap();
        assert_eq!(pool.pool_size(), 8192, "grew by max(request, pool size)");
        assert_eq!(pool.upstream_chunk_count(), 2);
        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
        unsafe { pool.deallocate(b, 256, Stream::DEFAULT) }.unwrap();
        assert_eq!(pool.release().unwrap(), 4096);
        assert_eq!(pool.pool_size(), 4096);
        assert_eq!(up.bytes_in_use(), 4096);
        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
        unsafe { pool.deallocate(a, 4096, Stream::DEFAULT) }.unwrap();
        drop(pool);
        assert_eq!(up.bytes_in_use(), 0, "dropping the pool returns everything");
    }

    #[test]
    fn a_repeated_failure_skips_the_merge_until_memory_is_freed() {
        // SAFETY: keys only: simulated memory never passes them to the driver.
        let (s1, s2) = unsafe { (Stream::from_raw(0x1000), Stream::from_raw(0x2000)) };
        let up = Arc::new(SimulatedMemoryResource::new(1 << 20));
        let pool = PoolMemoryResource::new(up.clone(), Some(512 << 10), None).unwrap();
        let a = pool.allocate(256 << 10, s1).unwrap();
        let b = pool.allocate(256 << 10, s2).unwrap();
        let c = pool.allocate(512 << 10, s1).unwrap();
        assert_eq!(up.bytes_in_use(), 1 << 20, "the device is full");
        let retries = || {
            pool.report()
                .unwrap()
                .memory_stats()
                .unwrap()
                .num_alloc_retries
        };
        for _ in 0..3 {
            let e = pool.allocate(512 << 10, s1).unwrap_err();
            assert!(e.is_out_of_memory(), "{e}");
        }
        assert_eq!(retries(), 1, "one merge, then nothing changed");
        // Frees on two streams change what the merge finds: the same request then gets the two
        // freed blocks, coalesced across the streams.
        free_on(&pool, b, 256 << 10, s2).unwrap();
        free_on(&pool, a, 256 << 10, s1).unwrap();
        let d = pool.allocate(512 << 10, s1).unwrap();
        assert_eq!((d, retries()), (a.min(b), 2));
        for _ in 0..3 {
            let e = pool.allocate(512 << 10, s2).unwrap_err();
            assert!(e.is_out_of_memory(), "{e}");
        }
        assert_eq!(retries(), 3);
        // Freed on another stream than the failed one: found by the next merge.
        free_on(&pool, c, 512 << 10, s1).unwrap();
        let f = pool.allocate(512 << 10, s2).unwrap();
        assert_eq!((f, retries()), (c, 4));
        for (p, s) in [(d, s1), (f, s2)] {
            free_on(&pool, p, 512 << 10, s).unwrap();
        }
        assert_eq!(pool.free_bytes(), pool.pool_size());
        assert_eq!(
            pool.report()
                .unwrap()
                .memory_stats()
                .unwrap()
                .allocation
                .current,
            0
        );
    }

    #[test]
    fn a_settled_failure_still_gives_back_chunks_for_a_smaller_request() {
        // A request above the maximum keeps the grown chunks; one below it, with nothing freed
        // since, still gives them back to grow a chunk large enough.
        let up = Arc::new(SimulatedMemoryResource::new(1 << 20));
        let pool = PoolMemoryResource::new(up.clone(), Some(256 << 10), Some(1 << 20)).unwrap();
        let a = pool.allocate(256 << 10, Stream::DEFAULT).unwrap();
        let b = pool.allocate(256 << 10, Stream::DEFAULT).unwrap();
        free_on(&pool, b, 256 << 10, Stream::DEFAULT).unwrap();
        assert_eq!(pool.upstream_chunk_count(), 2);
        assert!(pool
            .allocate(2 << 20, Stream::DEFAULT)
            .unwrap_err()
            .is_out_of_memory());
        assert_eq!(pool.upstream_chunk_count(), 2, "above the maximum: kept");
        let c = pool.allocate(700 << 10, Stream::DEFAULT).unwrap();
        assert_eq!(pool.pool_size(), (256 << 10) + (700 << 10));
        free_on(&pool, a, 256 << 10, Stream::DEFAULT).unwrap();
        free_on(&pool, c, 700 << 10, Stream::DEFAULT).unwrap();
    }

    #[test]
    fn a_free_with_another_size_is_a_logic_error_and_changes_nothing() {
        // SAFETY: a key only: simulated memory never passes it to the driver.
        let s1 = unsafe { Stream::from_raw(0x1000) };
        let pool = PoolMemoryResource::new(sim(1 << 20), Some(64 << 10), None).unwrap();
        let a = pool.allocate(1000, s1).unwrap();
        let b = pool.allocate(4096, s1).unwrap();
        let free_before = pool.free_bytes();
        for (stream, bytes) in [
            (s1, 4096),
            (Stream::DEFAULT, 4096),
            (s1, 0),
            (s1, usize::MAX),
        ] {
            let e = free_on(&pool, a, bytes, stream).unwrap_err();
            assert!(
                matches!(&e, Error::Logic(m) if m.contains("1024 bytes")),
                "{stream:?} {bytes}: {e}"
            );
        }
        assert_eq!(pool.free_bytes(), free_before, "nothing changed");
        // The size is checked up to the 256-byte rounding, on any stream.
        free_on(&pool, a, 1010, Stream::DEFAULT).unwrap();
        assert!(matches!(free_on(&pool, b, 1000, s1), Err(Error::Logic(_))));
        free_on(&pool, b, 4096, s1).unwrap();
        assert_eq!(pool.free_bytes(), pool.pool_size());
    }

    #[test]
    fn unknown_pointer_is_a_logic_error() {
        let pool = PoolMemoryResource::new(sim(1 << 20), Some(4096), None).unwrap();
        assert!(matches!(
            // SAFETY: the pool checks every free against its blocks (documented), so a bogus
            // pointer is reported and never dereferenced.
            unsafe { pool.deallocate(0x1234_5600, 256, Stream::DEFAULT) },
            Err(Error::Logic(_))
        ));
        // A double free, on the same stream or another one, and an interior pointer.
        // SAFETY: a key only: simulated memory never passes it to the driver.
        let s1 = unsafe { Stream::from_raw(0x1000) };
        let a = pool.allocate(1024, s1).unwrap();
        assert!(matches!(
            free_on(&pool, a + 256, 768, s1),
            Err(Error::Logic(_))
        ));
        free_on(&pool, a, 1024, s1).unwrap();
        for s in [s1, Stream::DEFAULT] {
            let e = free_on(&pool, a, 1024, s).unwrap_err();
            assert!(
                e.to_string().contains("did not allocate (or was freed)"),
                "{e}"
            );
        }
        assert_eq!(pool.free_bytes(), pool.pool_size(), "nothing changed");
        assert_eq!(pool.allocate(0, Stream::DEFAULT).unwrap(), 0);
        // SAFETY: the null pointer: a no-op by the trait's contract.
        unsafe { pool.deallocate(0, 0, Stream::DEFAULT) }.unwrap();
    }

    /// Simulated memory whose frees fail while `refuse` is set.
    #[derive(Debug)]
    struct Refusing {
        inner: SimulatedMemoryResource,
        refuse: std::sync::atomic::AtomicBool,
    }

    impl MemoryResource for Refusing {
        fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
            self.inner.allocate(bytes, stream)
        }
        #[allow(unsafe_code)]
        unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
            if self.refuse.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(Error::Logic("the upstream refuses".into()));
            }
            // SAFETY: the caller's contract, passed on.
            unsafe { self.inner.deallocate(ptr, bytes, stream) }
        }
        fn kind(&self) -> MemoryKind {
            MemoryKind::Simulated
        }
        fn memory_info(&self) -> Option<(usize, usize)> {
            self.inner.memory_info()
        }
        fn name(&self) -> &'static str {
            "refusing"
        }
    }

    /// A pool over `Refusing` memory of `size` bytes (refusing frees from the start where
    /// `refuse`): a 1 MiB initial chunk, grown for a 4 MiB block it served and freed.
    fn pool_of_two_chunks(size: usize, refuse: bool) -> (Arc<Refusing>, PoolMemoryResource) {
        let up = Arc::new(Refusing {
            inner: SimulatedMemoryResource::new(size),
            refuse: refuse.into(),
        });
        let pool = PoolMemoryResource::new(up.clone(), Some(1 << 20), None).unwrap();
        let a = pool.allocate(4 << 20, Stream::DEFAULT).unwrap();
        free_on(&pool, a, 4 << 20, Stream::DEFAULT).unwrap();
        (up, pool)
    }

    #[test]
    fn a_refused_give_back_keeps_the_chunks_in_the_books() {
        let (up, pool) = pool_of_two_chunks(1 << 30, true);
        let (held, chunks) = (pool.pool_size(), pool.upstream_chunk_count());
        assert!(chunks >= 2);
        assert!(pool.release().is_err(), "the upstream's error is reported");
        assert_eq!(pool.pool_size(), held, "still held: the upstream kept them");
        assert_eq!(pool.upstream_chunk_count(), chunks);
        assert_eq!(pool.free_bytes(), held, "and still free");
        assert_eq!(up.inner.bytes_in_use(), held);
        let c = pool.allocate(4 << 20, Stream::DEFAULT).unwrap();
        free_on(&pool, c, 4 << 20, Stream::DEFAULT).unwrap();
        up.refuse.store(false, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(pool.release().unwrap(), held, "retried, and given back");
        assert_eq!((pool.pool_size(), up.inner.bytes_in_use()), (0, 0));
    }

    #[test]
    fn a_refused_give_back_on_the_out_of_memory_path_keeps_the_chunks() {
        let (up, pool) = pool_of_two_chunks(16 << 20, false);
        let held = pool.pool_size();
        up.refuse.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(pool.allocate(15 << 20, Stream::DEFAULT).is_err());
        assert_eq!(pool.pool_size(), held);
        assert_eq!(up.inner.bytes_in_use(), held);
        assert_eq!(pool.free_bytes(), held);
        up.refuse.store(false, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(pool.release().unwrap(), held);
        assert_eq!(up.inner.bytes_in_use(), 0);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Issue 39: a request that the pool's free chunks cannot hold, but that fits the
        /// memory below once they are given back, is served (RMM refuses it): any initial size,
        /// blocks live in chunks of their own, any request up to what the device has left
        /// besides the live chunks.
        #[test]
        fn a_request_its_free_chunks_cannot_hold_is_served_by_giving_them_back(
            initial_mib in 0usize..40,
            live in proptest::collection::vec(1usize..8, 0..4),
            request_frac in 0.0f64..1.0,
        ) {
            const MIB: usize = 1 << 20;
            let device = 64 * MIB;
            let setup = || {
                let up = Arc::new(SimulatedMemoryResource::new(device));
                let pool =
                    PoolMemoryResource::new(up.clone(), Some(initial_mib * MIB), None).unwrap();
                let held: Vec<(usize, usize)> = live
                    .iter()
                    .filter_map(|mib| {
                        let p = pool.allocate(mib * MIB, Stream::DEFAULT).ok()?;
                        Some((p, mib * MIB))
                    })
                    .collect();
                (up, pool, held)
            };
            // The same pool, asked to release: what the chunks holding live blocks take.
            let (twin_up, twin, twin_held) = setup();
            twin.release().unwrap();
            let room = device - twin_up.bytes_in_use();
            for (p, n) in twin_held {
                free_on(&twin, p, n, Stream::DEFAULT).unwrap();
            }
            let (_up, pool, mut held) = setup();
            let request = ((room as f64 * request_frac) as usize) / MIB * MIB;
            if request > 0 {
                let p = pool.allocate(request, Stream::DEFAULT);
                proptest::prop_assert!(p.is_ok(), "{request} of {room}: {:?}", p.err());
                held.push((p.unwrap(), request));
            }
            for (p, n) in held {
                free_on(&pool, p, n, Stream::DEFAULT).unwrap();
            }
        }
    }
}
