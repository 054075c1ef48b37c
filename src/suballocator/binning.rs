//! `BinningMemoryResource`: requests routed by size to bins, the rest to the upstream.

use super::core::{current_thread_tag, ListCounters};
use super::fixed_size::{FixedSizeMemoryResource, DEFAULT_BLOCKS_TO_PREALLOCATE};
use crate::cuda::Stream;
use crate::error::{Error, Result};
use crate::live::LiveAllocations;
use crate::report::{MemoryStats, SegmentInfo};
use crate::resource::graph;
use crate::resource::{Footprint, MemoryResource, PoolReport, SharedResource};
use parking_lot::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Routes each request to the bin with the smallest size at least the request, and requests
/// larger than every bin to the upstream (RMM's `binning_memory_resource`). Bins are any
/// resources; by default fixed-size resources over the upstream. Cheap to clone.
///
/// A free goes where its size routes it. The allocations made through the upstream route are
/// recorded, so a free routed there must be one of them with its size: a bin's block freed
/// with a size above every bin is [`Error::Logic`] and changes nothing (the upstream could not
/// tell it from the bin's own chunk, which starts at the same address).
///
/// Bins added after the resource served allocations change where a size routes: from then on a
/// free goes to the upstream when the upstream route handed the pointer out, and to the
/// smallest bin that takes it back otherwise (a bin that does not know the pointer refuses it
/// with [`Error::Logic`], as the fixed-size bins do, and the next larger bin is asked).
///
/// A bin that reaches this resource (itself, or a stack over it) is refused: allocations would
/// recurse for ever.
///
/// # Time Complexity
/// Allocate and free take a shared read lock of the calling thread's copy of the bins (one of
/// 16, so threads do not contend on one lock word) and a binary search over the bins, then the
/// bin's own cost; the upstream route adds one hash operation under one of 64 locks.
#[derive(Clone, Debug)]
pub struct BinningMemoryResource {
    inner: Arc<Inner>,
}

struct Inner {
    upstream: SharedResource,
    /// Bins sorted by size, one copy per shard ([`BinShards`]).
    bins: BinShards,
    /// What the upstream route handed out (pointer -> bytes).
    from_upstream: LiveAllocations,
    /// The upstream route's figures (`memory_stats`; the bins count their own).
    upstream_counters: parking_lot::Mutex<ListCounters>,
    /// Set by the first allocation.
    served: AtomicBool,
    /// Set when a bin was added after the first allocation: frees then route by record.
    rerouted: AtomicBool,
    /// Blocks per chunk of the fixed-size bins this resource makes.
    blocks: usize,
    /// Its link: the upstream's and every bin's, grown as bins are added (its cells are the ones
    /// it hands up, so a resource built over it before a bin sees the bin: its calls, its pools
    /// whose memory moves).
    link: crate::resource::Link,
}

/// The bins, copied into [`SHARDS`] cache-line-aligned locks: a thread reads the copy of its
/// own shard, so threads that allocate at once do not write one lock word between them (a
/// shared read lock's count is such a write); adding a bin writes every copy.
struct BinShards {
    shards: Box<[BinShard]>,
}

/// Shards of the bins: at least as many as the threads that usually allocate at once.
const SHARDS: usize = 16;

type Bins = Vec<(usize, SharedResource)>;

#[repr(align(128))]
struct BinShard(RwLock<Bins>);

impl BinShards {
    fn new() -> Self {
        BinShards {
            shards: (0..SHARDS)
                .map(|_| BinShard(RwLock::new(Vec::new())))
                .collect(),
        }
    }

    /// The calling thread's copy, read-locked (recursively: a bin may call back in).
    #[inline]
    fn read(&self) -> parking_lot::RwLockReadGuard<'_, Bins> {
        self.shards[thread_shard()].0.read_recursive()
    }

    /// Adds bin `size` to every copy, in shard order (all copies under their write locks at
    /// once, so no reader sees the bin in one shard and not another); false when a bin of
    /// that size exists.
    fn insert(&self, size: usize, resource: SharedResource) -> bool {
        let mut guards: Vec<_> = self.shards.iter().map(|s| s.0.write()).collect();
        let at = guards[0].partition_point(|(s, _)| *s < size);
        if guards[0].get(at).is_some_and(|(s, _)| *s == size) {
            return false;
        }
        for g in &mut guards {
            g.insert(at, (size, resource.clone()));
        }
        true
    }
}

/// This thread's shard: threads take them in turn, by their tag (1, 2, ... as they first ask
/// for one). The tag is a `u64` thread-local with no destructor, so reading it from another
/// thread-local's destructor does not panic (a test does it).
#[inline]
fn thread_shard() -> usize {
    (current_thread_tag() % SHARDS as u64) as usize
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bins: Vec<(usize, &str)> = self
            .bins
            .read()
            .iter()
            .map(|(s, r)| (*s, r.name()))
            .collect();
        f.debug_struct("BinningMemoryResource")
            .field("upstream", &self.upstream)
            .field("bins", &bins)
            .finish()
    }
}

impl BinningMemoryResource {
    /// A binning resource over `upstream`; when both exponents are given, with fixed-size bins of
    /// 2^min, 2^(min+1), ..., 2^max bytes (none when min > max).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an exponent of 64 or more; the upstream's error when a bin
    /// cannot preallocate.
    pub fn new(
        upstream: SharedResource,
        min_size_exponent: Option<u32>,
        max_size_exponent: Option<u32>,
    ) -> Result<Self> {
        Self::with_blocks(
            upstream,
            min_size_exponent,
            max_size_exponent,
            DEFAULT_BLOCKS_TO_PREALLOCATE,
        )
    }

    /// As [`new`](Self::new), with `blocks` blocks per chunk in the fixed-size bins it makes
    /// (here and in [`add_bin`](Self::add_bin) without a resource).
    ///
    /// # Errors
    /// As [`new`](Self::new); [`Error::InvalidArgument`] for zero blocks.
    pub fn with_blocks(
        upstream: SharedResource,
        min_size_exponent: Option<u32>,
        max_size_exponent: Option<u32>,
        blocks: usize,
    ) -> Result<Self> {
        if blocks == 0 {
            return Err(Error::invalid(
                "blocks_to_preallocate",
                "blocks_to_preallocate=0: must be positive (at least 1 block per chunk; default 128)",
            ));
        }
        // Its link, held: the upstream's cells joined, each bin's joined as it is added.
        let link =
            crate::resource::Link::join(&[upstream.link()]).unwrap_or_else(|| upstream.link());
        let mr = BinningMemoryResource {
            inner: Arc::new(Inner {
                link,
                upstream,
                bins: BinShards::new(),
                from_upstream: LiveAllocations::new(),
                upstream_counters: parking_lot::Mutex::new(ListCounters::default()),
                served: AtomicBool::new(false),
                rerouted: AtomicBool::new(false),
                blocks,
            }),
        };
        if let (Some(min), Some(max)) = (min_size_exponent, max_size_exponent) {
            if max >= usize::BITS {
                return Err(Error::invalid(
                    "max_size_exponent",
                    format!("must be below {}", usize::BITS),
                ));
            }
            for e in min..=max {
                mr.add_bin(1usize << e, None)?;
            }
        }
        Ok(mr)
    }

    /// Adds a bin for requests up to `allocation_size` bytes (rounded up to 256): `bin_resource`,
    /// or a fixed-size resource of that block size over the upstream. As in RMM, a bin of a size
    /// that already exists is kept and the call does nothing.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero or overflowing size, or a `bin_resource` that
    /// reaches this resource (a cycle) or would make the stack deeper than
    /// [`MAX_STACK_DEPTH`](crate::resource::graph::MAX_STACK_DEPTH); the upstream's error when
    /// a new fixed-size bin cannot preallocate.
    pub fn add_bin(
        &self,
        allocation_size: usize,
        bin_resource: Option<SharedResource>,
    ) -> Result<()> {
        let size = super::fixed_size::block_of("allocation_size", allocation_size)?;
        // A bin that would make a cycle is refused even where a bin of its size exists (and
        // the call would change nothing): the caller's graph is wrong either way.
        if let Some(r) = &bin_resource {
            if graph::reaches(r, self) {
                return Err(Error::invalid(
                    "bin_resource",
                    "the bin reaches this binning resource (it is the resource itself, or a \
                     stack over it): allocations would recurse for ever",
                ));
            }
            graph::check_upstream("bin_resource", r)?;
        }
        if self.inner.bins.read().iter().any(|(s, _)| *s == size) {
            return Ok(());
        }
        let resource = match bin_resource {
            Some(r) => r,
            None => Arc::new(FixedSizeMemoryResource::new(
                self.inner.upstream.clone(),
                size,
                self.inner.blocks,
            )?),
        };
        // The profile and the pools below grow before the bin serves a call (a bin of this size
        // added by another thread meanwhile leaves them at most larger than need be, never
        // smaller).
        let part = resource.link();
        self.inner.link.calls.add_part(&part.calls);
        self.inner.link.sleep.add_part(&part.sleep);
        if !self.inner.bins.insert(size, resource) {
            return Ok(()); // added by another thread meanwhile
        }
        if self.inner.served.load(Ordering::Relaxed) {
            self.inner.rerouted.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    /// The bins, by increasing size: (largest request served, resource).
    pub fn bins(&self) -> Vec<(usize, SharedResource)> {
        self.inner.bins.read().clone()
    }

    /// The upstream resource (served requests larger than every bin).
    pub fn upstream(&self) -> &SharedResource {
        &self.inner.upstream
    }
}

impl BinningMemoryResource {
    /// A request larger than every bin, from the upstream, recorded.
    fn allocate_upstream(&self, bytes: usize, stream: Stream) -> Result<usize> {
        let ptr = self.inner.upstream.allocate(bytes, stream)?;
        if ptr != 0 {
            self.inner.from_upstream.insert(ptr, bytes)?;
            self.inner.upstream_counters.lock().allocated(bytes);
        }
        Ok(ptr)
    }

    /// A free routed to the upstream: checked against the record first.
    ///
    /// # Safety
    /// Preconditions 3 and 4 of [`MemoryResource::deallocate`] (the record checks 1 and 2).
    #[allow(unsafe_code)]
    unsafe fn deallocate_upstream(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        self.inner.from_upstream.free_checked(
            ptr,
            bytes,
            Some("binning_memory_resource"),
            || {
                // SAFETY: the record shows `ptr` came from the upstream with `bytes` and was
                // not freed since (1, 2); the caller gives 3 and 4.
                unsafe { self.inner.upstream.deallocate(ptr, bytes, stream) }
            },
        )?;
        self.inner.upstream_counters.lock().freed(bytes);
        Ok(())
    }

    /// `f` of each bin's report, in size order.
    fn bins_reports<T>(&self, f: impl Fn(&dyn PoolReport) -> Option<T>) -> Vec<T> {
        self.inner
            .bins
            .read()
            .iter()
            .filter_map(|(_, bin)| bin.report().and_then(&f))
            .collect()
    }

    /// The report of the upstream where it holds memory (a pool), not a source's.
    fn holder(&self) -> Option<&dyn PoolReport> {
        self.inner.upstream.report().filter(|r| !r.is_source())
    }
}

impl PoolReport for BinningMemoryResource {
    /// PyTorch's figures of the memory the stack holds, as its snapshot lays it out: over a
    /// pool, the pool's (its blocks, a bin's chunks among them); over a source, the bins'
    /// figures (their chunks are segments) and each allocation of the upstream route as a segment
    /// of its own. None over memory that keeps no such figures (a tiered stack: per tier).
    fn memory_stats(&self) -> Option<MemoryStats> {
        if let Some(pool) = self.holder() {
            return pool.memory_stats();
        }
        let bins = self
            .bins_reports(|r| r.memory_stats())
            .into_iter()
            .fold(MemoryStats::default(), MemoryStats::plus);
        let mut route = MemoryStats::default();
        self.inner.upstream_counters.lock().add_to(&mut route);
        Some(MemoryStats {
            allocation: bins.allocation.plus(route.allocation),
            allocated_bytes: bins.allocated_bytes.plus(route.allocated_bytes),
            segment: bins.segment.plus(route.allocation),
            reserved_bytes: bins.reserved_bytes.plus(route.allocated_bytes),
            ..bins
        })
    }

    fn reset_peak_memory_stats(&self) -> bool {
        self.inner.upstream_counters.lock().reset_peaks();
        let bins = self.bins_reports(|r| Some(r.reset_peak_memory_stats()));
        let pool = self
            .holder()
            .is_some_and(PoolReport::reset_peak_memory_stats);
        pool || !bins.is_empty()
    }

    /// Over a pool: its segments (a bin's chunk is one of its blocks); over a source: every
    /// bin's segments and one segment per allocation of the upstream route.
    fn memory_snapshot(&self) -> Option<Vec<SegmentInfo>> {
        if let Some(pool) = self.holder() {
            return pool.memory_snapshot();
        }
        let mut out: Vec<SegmentInfo> = self
            .bins_reports(|r| r.memory_snapshot())
            .into_iter()
            .flatten()
            .collect();
        let mut route = self.inner.from_upstream.entries();
        route.sort_unstable();
        out.extend(
            route
                .into_iter()
                .map(|(address, size)| SegmentInfo::one_block(address, size)),
        );
        Some(out)
    }

    /// The memory the stack holds. Over a resource that holds memory (a pool), that resource's
    /// footprint, with the bins' free blocks (inside the pool's allocated part, since the bins'
    /// chunks come from it) added to its free bytes; over one that does not (CUDA), the bins'
    /// footprints summed. Largest free block: the largest of all.
    fn footprint(&self) -> Footprint {
        let mut bins = Footprint::default();
        for (_, bin) in self.inner.bins.read().iter() {
            if let Some(f) = bin.report().map(PoolReport::footprint) {
                bins.held_bytes = bins.held_bytes.saturating_add(f.held_bytes);
                bins.free_bytes = bins.free_bytes.saturating_add(f.free_bytes);
                bins.free_blocks = bins.free_blocks.saturating_add(f.free_blocks);
                bins.largest_free_block = bins.largest_free_block.max(f.largest_free_block);
            }
        }
        // A source's free memory (a simulated device's) is not held here: bins only then.
        let holder = self.inner.upstream.report().filter(|r| !r.is_source());
        match holder.map(PoolReport::footprint) {
            Some(pool) => Footprint {
                held_bytes: pool.held_bytes,
                free_bytes: pool.free_bytes.saturating_add(bins.free_bytes),
                largest_free_block: pool.largest_free_block.max(bins.largest_free_block),
                free_blocks: pool.free_blocks.saturating_add(bins.free_blocks),
            },
            None => bins,
        }
    }

    /// The upstream's held bytes (over a pool), else the bins' summed, without walking lists.
    fn held_bytes(&self) -> usize {
        match self.inner.upstream.report().filter(|r| !r.is_source()) {
            Some(pool) => pool.held_bytes(),
            None => self
                .inner
                .bins
                .read()
                .iter()
                .filter_map(|(_, bin)| bin.report().map(PoolReport::held_bytes))
                .fold(0usize, usize::saturating_add),
        }
    }
}

impl BinningMemoryResource {
    /// A free after bins were added to a resource in use: to the upstream when its route handed
    /// `ptr` out, else to the smallest bin of at least `bytes` that takes it back.
    ///
    /// # Safety
    /// Preconditions 3 and 4 of [`MemoryResource::deallocate`].
    #[allow(unsafe_code)]
    unsafe fn deallocate_rerouted(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        if self.inner.from_upstream.size_of(ptr).is_some() {
            // SAFETY: the caller's contract; the record checks the rest.
            return unsafe { self.deallocate_upstream(ptr, bytes, stream) };
        }
        let bins = self.inner.bins.read();
        let mut refused = None;
        for (_, bin) in &bins[bins.partition_point(|(s, _)| *s < bytes)..] {
            // SAFETY: the caller's contract; a bin that did not hand `ptr` out refuses it
            // (Error::Logic) and changes nothing.
            match unsafe { bin.deallocate(ptr, bytes, stream) } {
                Err(Error::Logic(e)) => {
                    refused.get_or_insert(e);
                }
                other => return other,
            }
        }
        Err(Error::Logic(format!(
            "binning_memory_resource: deallocate of {ptr:#x} with size {bytes}: no bin and not \
             the upstream route handed it out{}",
            refused.map(|e| format!(" ({e})")).unwrap_or_default()
        )))
    }
}

impl MemoryResource for BinningMemoryResource {
    #[inline]
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        if !self.inner.served.load(Ordering::Relaxed) {
            self.inner.served.store(true, Ordering::Relaxed);
        }
        let bins = self.inner.bins.read();
        match bins.get(bins.partition_point(|(s, _)| *s < bytes)) {
            Some((_, bin)) => bin.allocate(bytes, stream),
            None => self.allocate_upstream(bytes, stream),
        }
    }

    #[inline]
    // The trait's method is unsafe; this body checks the pointer against the blocks it handed
    // out and relies only on the stream-ordering part of the contract.
    #[allow(unsafe_code)]
    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        if self.inner.rerouted.load(Ordering::Relaxed) {
            // SAFETY: the caller's contract, passed on.
            return unsafe { self.deallocate_rerouted(ptr, bytes, stream) };
        }
        let bins = self.inner.bins.read();
        match bins.get(bins.partition_point(|(s, _)| *s < bytes)) {
            // SAFETY: the caller's contract; a size maps to one bin (or the upstream) on both
            // allocate and free, so `ptr` came from the resource it is returned to.
            Some((_, bin)) => unsafe { bin.deallocate(ptr, bytes, stream) },
            // SAFETY: as above.
            None => unsafe { self.deallocate_upstream(ptr, bytes, stream) },
        }
    }

    crate::resource::memory_from!(|this| this.inner.upstream);

    fn memory_info(&self) -> Option<(usize, usize)> {
        self.inner.upstream.memory_info()
    }

    fn report(&self) -> Option<&dyn PoolReport> {
        Some(self)
    }

    fn identity(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    fn upstreams(&self) -> Vec<SharedResource> {
        let mut all = vec![self.inner.upstream.clone()];
        all.extend(self.inner.bins.read().iter().map(|(_, bin)| bin.clone()));
        all
    }

    /// The upstream's and every bin's, joined, held and grown as bins are added: binning
    /// carves nothing itself (its bins do, and each is a tenant of the pools below its own
    /// upstream).
    fn link(&self) -> crate::resource::Link {
        self.inner.link.clone()
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn name(&self) -> &'static str {
        "binning"
    }
}

#[cfg(test)]
// Tests call the unsafe `deallocate` and make fake stream keys, each with its SAFETY line.
#[allow(unsafe_code)]
mod tests {
    use super::*;
    use crate::resource::SimulatedMemoryResource;
    use crate::test_support::free;

    #[test]
    fn a_thread_local_destructor_may_allocate_and_free() {
        struct Late(BinningMemoryResource);
        impl Drop for Late {
            fn drop(&mut self) {
                // Runs while the thread's locals are destroyed: the shard is still read.
                let p = self.0.allocate(512, Stream::DEFAULT).unwrap();
                free(&self.0, p, 512).unwrap();
            }
        }
        thread_local! {
            static LATE: std::cell::RefCell<Option<Late>> = const { std::cell::RefCell::new(None) };
        }
        let up = Arc::new(SimulatedMemoryResource::new(1 << 24));
        let mr = BinningMemoryResource::new(up, Some(10), Some(12)).unwrap();
        std::thread::spawn(move || {
            let p = mr.allocate(512, Stream::DEFAULT).unwrap();
            free(&mr, p, 512).unwrap();
            LATE.with(|late| *late.borrow_mut() = Some(Late(mr)));
        })
        .join()
        .expect("a free from a thread-local destructor must not panic");
    }

    #[test]
    fn requests_go_to_the_smallest_bin_that_fits_or_upstream() {
        let up = Arc::new(SimulatedMemoryResource::new(1 << 24));
        let mr = BinningMemoryResource::new(up.clone(), Some(10), Some(12)).unwrap();
        let sizes: Vec<usize> = mr.bins().iter().map(|(s, _)| *s).collect();
        assert_eq!(sizes, vec![1024, 2048, 4096]);
        let custom: SharedResource = Arc::new(SimulatedMemoryResource::new(1 << 20));
        mr.add_bin(300, Some(custom.clone())).unwrap();
        assert_eq!(mr.bins()[0].0, 512);
        mr.add_bin(1024, Some(custom.clone())).unwrap(); // exists: kept
        assert_eq!(mr.bins()[1].1.name(), "fixed_size");

        let p = mr.allocate(500, Stream::DEFAULT).unwrap();
        assert_eq!(custom.report().unwrap().footprint().held_bytes, 512);
        let q = mr.allocate(1500, Stream::DEFAULT).unwrap();
        assert_eq!(
            mr.bins()[2].1.report().unwrap().footprint().free_blocks,
            127
        );
        let in_use = up.bytes_in_use();
        let r = mr.allocate(5000, Stream::DEFAULT).unwrap();
        assert_eq!(
            up.bytes_in_use(),
            in_use + 5120,
            "above the largest bin: upstream"
        );
        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
        unsafe { mr.deallocate(p, 500, Stream::DEFAULT) }.unwrap();
        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
        unsafe { mr.deallocate(q, 1500, Stream::DEFAULT) }.unwrap();
        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
        unsafe { mr.deallocate(r, 5000, Stream::DEFAULT) }.unwrap();
        assert_eq!(up.bytes_in_use(), in_use);
        assert_eq!(custom.report().unwrap().footprint().held_bytes, 0);
        assert_eq!(mr.name(), "binning");
        assert!(mr.add_bin(0, None).is_err());
    }

    #[test]
    fn a_bin_block_freed_with_a_size_above_the_bins_changes_nothing() {
        // Issue 9: the free reached the pool, which freed the bin's chunk (it starts where the
        // bin's first block does), and the pool handed the bin's blocks out again.
        let up = Arc::new(SimulatedMemoryResource::new(64 << 20));
        let pool = Arc::new(
            crate::suballocator::PoolMemoryResource::new(up, Some(1 << 20), Some(32 << 20))
                .unwrap(),
        );
        let mr = BinningMemoryResource::new(pool.clone(), Some(10), Some(12)).unwrap();
        let a = mr.allocate(1000, Stream::DEFAULT).unwrap();
        let chunk = 1024 * DEFAULT_BLOCKS_TO_PREALLOCATE;
        let pool_free = pool.free_bytes();
        for bytes in [chunk, chunk - 100, 8192] {
            let e = free(&mr, a, bytes).unwrap_err();
            assert!(matches!(e, Error::Logic(_)), "{bytes}: {e}");
        }
        assert_eq!(
            pool.free_bytes(),
            pool_free,
            "the bin's chunk stays allocated"
        );
        let big = mr.allocate(chunk, Stream::DEFAULT).unwrap();
        assert!(
            big >= a + chunk || big + chunk <= a,
            "no overlap with the bin's chunk"
        );
        // The upstream route checks its own frees too.
        assert!(matches!(free(&mr, big, chunk + 4096), Err(Error::Logic(_))));
        free(&mr, big, chunk).unwrap();
        assert!(matches!(free(&mr, big, chunk), Err(Error::Logic(_))));
        free(&mr, a, 1000).unwrap();
    }
}
