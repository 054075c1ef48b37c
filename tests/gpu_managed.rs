//! GPU tests of managed memory without the penalty (issue 19): the cache's reuse and give-back,
//! placement of fresh ranges, relief of the cache when another allocation runs out, and the
//! fallback adaptor under a device budget. They need a CUDA GPU and are ignored elsewhere.
//!
//! Never more managed memory than the GPU has free: every test sizes its managed allocations
//! from `cuMemGetInfo`, at most half of what is free.

use rrmm::cuda::{self, OwnedStream};
use rrmm::pressure::{self, Place};
use rrmm::resource::UncachedManagedMemoryResource;
use rrmm::{
    CudaMemoryResource, DeviceBuffer, FallbackResourceAdaptor, LimitingResourceAdaptor,
    ManagedMemoryResource, ManagedOptions, MemoryKind, MemoryResource, PoolMemoryResource,
    SharedResource, Stream,
};
use std::sync::Arc;

const MIB: usize = 1 << 20;

fn free(mr: &dyn MemoryResource, ptr: usize, bytes: usize, stream: Stream) {
    // SAFETY: `ptr` came from `mr` with `bytes` and is freed once; the tests synchronize before
    // they free memory that work used.
    unsafe { mr.deallocate(ptr, bytes, stream) }.unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_freed_range_is_reused_on_its_stream_and_given_back_on_release() {
    let cache = ManagedMemoryResource::new().unwrap();
    assert_eq!(cache.kind(), MemoryKind::Managed);
    let stream = OwnedStream::new(true).unwrap();
    let s = stream.stream();
    let a = cache.allocate(64 * MIB, s).unwrap();
    assert!(cuda::is_managed(a));
    free(&cache, a, 64 * MIB, s);
    assert_eq!(cache.cached_bytes(), 64 * MIB);
    let b = cache.allocate(64 * MIB, s).unwrap();
    assert_eq!(b, a, "the same range, no driver call");
    // Data works through the reused range.
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    let buf = DeviceBuffer::from_host(&data, s, Arc::new(cache.clone())).unwrap();
    assert_eq!(buf.to_vec().unwrap(), data);
    drop(buf);
    free(&cache, b, 64 * MIB, s);
    stream.synchronize().unwrap();
    let released = cache.release().unwrap();
    assert!(released >= 64 * MIB, "released {released}");
    assert_eq!((cache.cached_bytes(), cache.held_bytes()), (0, 0));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_fresh_range_is_prefetched_to_the_device_while_it_has_room() {
    let device = cuda::current_device().unwrap();
    if !cuda::concurrent_managed_access(device) {
        eprintln!("skipped: this device cannot place managed memory");
        return;
    }
    let managed = UncachedManagedMemoryResource::new().unwrap();
    let placement = rrmm::resource::DevicePlacement::new(device);
    let stream = OwnedStream::new(true).unwrap();
    let p = managed.allocate(16 * MIB, stream.stream()).unwrap();
    let placed = rrmm::resource::PlaceRange::place(&placement, p, 16 * MIB, stream.stream());
    assert_eq!(placed.map(|s| (s.device, s.host)), Some((16 * MIB, 0)));
    stream.synchronize().unwrap();
    // SAFETY: `p` is managed memory of 16 MiB, live.
    let location = unsafe { cuda::mem_last_prefetch_location(p, 16 * MIB) }.unwrap();
    assert_eq!(location, device as i32);
    free(&managed, p, 16 * MIB, Stream::DEFAULT);
}

/// RMM's own test: a fresh small managed buffer has no prefetch location (placement leaves
/// ranges under 2 MiB to the driver's first touch), through the cache and through a pool over
/// it; a large block of the pool is placed on the device, once.
#[test]
#[ignore = "needs a CUDA GPU"]
fn small_blocks_are_not_prefetched_and_large_pool_blocks_are() {
    let device = cuda::current_device().unwrap();
    if !cuda::concurrent_managed_access(device) {
        eprintln!("skipped: this device cannot place managed memory");
        return;
    }
    let cache = ManagedMemoryResource::new().unwrap();
    let small = cache.allocate(256, Stream::DEFAULT).unwrap();
    // SAFETY: `small` is managed memory of 256 bytes, live.
    let location = unsafe { cuda::mem_last_prefetch_location(small, 256) }.unwrap();
    assert_eq!(location, -2, "a fresh 256-byte range was prefetched");
    free(&cache, small, 256, Stream::DEFAULT);

    let managed = ManagedMemoryResource::with_options(ManagedOptions {
        cache_limit: Some(0),
        placement: rrmm::resource::PlacementMode::Blocks,
    })
    .unwrap();
    let pool = PoolMemoryResource::new(Arc::new(managed.clone()), Some(256 * MIB), None).unwrap();
    let small = pool.allocate(256, Stream::DEFAULT).unwrap();
    // SAFETY: `small` lies in the pool's managed chunk, live.
    let location = unsafe { cuda::mem_last_prefetch_location(small, 256) }.unwrap();
    assert_eq!(location, -2, "the pool's chunk was prefetched whole");
    let big = pool.allocate(64 * MIB, Stream::DEFAULT).unwrap();
    cuda::context_synchronize().unwrap();
    let (start, end) = rrmm::resource::whole_granules(big, 64 * MIB).unwrap();
    // SAFETY: the whole granules of `big`, live managed memory.
    let location = unsafe { cuda::mem_last_prefetch_location(start, end - start) }.unwrap();
    assert_eq!(location, device as i32, "a 64 MiB block was not placed");
    assert_eq!(managed.placed_bytes().device, end - start);
    free(&pool, big, 64 * MIB, Stream::DEFAULT);
    let again = pool.allocate(64 * MIB, Stream::DEFAULT).unwrap();
    assert_eq!(managed.placed_bytes().device, end - start, "placed twice");
    free(&pool, again, 64 * MIB, Stream::DEFAULT);
    free(&pool, small, 256, Stream::DEFAULT);
}

/// The cache holds a third of the free device memory, resident on the device; then a plain
/// `cuMemAlloc` asks for three quarters of what was free. Either the driver finds the room by
/// itself, or the allocation's failure relieves the cache and the second try succeeds: the
/// allocation must succeed. The test prints which of the two happened.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_device_allocation_that_runs_out_takes_the_cache_back() {
    let device = cuda::current_device().unwrap();
    let (free_before, _) = cuda::device_memory_info(device).unwrap();
    let cache = ManagedMemoryResource::with_options(ManagedOptions {
        cache_limit: Some(free_before),
        placement: rrmm::resource::PlacementMode::Ranges,
    })
    .unwrap();
    let third = (free_before / 3) & !(2 * MIB - 1);
    let stream = OwnedStream::new(true).unwrap();
    let p = cache.allocate(third, stream.stream()).unwrap();
    // Touch every page on the device (the prefetch placed it; a memset makes sure).
    // SAFETY: `p` holds `third` bytes; the memset is ordered on the stream, synchronized below.
    unsafe { cuda::memset_d32_async(p, 0x5a5a_5a5a, third / 4, stream.stream()) }.unwrap();
    stream.synchronize().unwrap();
    free(&cache, p, third, stream.stream());
    // The range is cached at its size class (at most 1/32 above the request).
    let cached = cache.cached_bytes();
    assert!(
        (third..=third + third / 32).contains(&cached),
        "cached {cached} for a request of {third}"
    );
    let cuda_mr = CudaMemoryResource::new().unwrap();
    let want = (free_before / 4 * 3) & !(2 * MIB - 1);
    let q = cuda_mr
        .allocate(want, Stream::DEFAULT)
        .expect("the cache goes back when the device needs the memory");
    let relieved = cache.cached_bytes() == 0;
    eprintln!(
        "device allocation of {} MiB beside a cache of {} MiB: {}",
        want / MIB,
        third / MIB,
        if relieved {
            "the first try failed and the cache was relieved"
        } else {
            "the driver found room by itself (the cache stayed)"
        }
    );
    free(&cuda_mr, q, want, Stream::DEFAULT);
    // A relief by hand gives back what is left.
    let given = pressure::relieve(Place::Device(device));
    assert_eq!(cache.cached_bytes(), 0);
    assert!(relieved || given >= third);
}

/// The device budget (a limit far below free memory) stands for a full device: what passes it
/// goes to managed memory, data round trips through both, and the counters say where.
#[test]
#[ignore = "needs a CUDA GPU"]
fn the_fallback_serves_past_a_device_budget_from_managed_memory() {
    let budget = 64 * MIB;
    let device: SharedResource = Arc::new(LimitingResourceAdaptor::new(
        Arc::new(CudaMemoryResource::new().unwrap()),
        budget,
    ));
    let managed: SharedResource = Arc::new(ManagedMemoryResource::new().unwrap());
    let fallback = Arc::new(FallbackResourceAdaptor::new(device, managed));
    let stream = OwnedStream::new(true).unwrap();
    let mut bufs = Vec::new();
    for i in 0..6u8 {
        let data = vec![i; 24 * MIB];
        let buf = DeviceBuffer::from_host(&data, stream.stream(), fallback.clone()).unwrap();
        bufs.push((buf, data));
    }
    let counts = fallback.counts();
    assert_eq!(counts.upstream_allocations, 2, "two of 24 MiB fit 64 MiB");
    assert_eq!(counts.alternate_allocations, 4);
    assert_eq!(counts.alternate_bytes, 4 * 24 * MIB);
    for (buf, data) in &bufs {
        assert_eq!(&buf.to_vec().unwrap(), data);
    }
    for (i, (buf, _)) in bufs.iter().enumerate().skip(2) {
        assert!(cuda::is_managed(buf.ptr()), "buffer {i} is managed memory");
    }
    drop(bufs);
    let counts = fallback.counts();
    assert_eq!((counts.upstream_bytes, counts.alternate_bytes), (0, 0));
}
