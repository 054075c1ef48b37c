//! GPU tests of pinned host memory (issue 20): large allocations registered on the GPU's NUMA
//! node, small ones from `cuMemHostAlloc`, asynchronous copies with the data checked, and the
//! expandable pool on registered host memory. They need a CUDA GPU and are ignored elsewhere.

use rrmm::cuda::{self, OwnedStream};
use rrmm::os::host_pages::{numa_node_count, numa_node_of};
use rrmm::resource::{HostVirtualMemory, PinnedOptions, VirtualMemory};
use rrmm::suballocator::{ExpandableMemoryResource, ExpandableSizes};
use rrmm::{CudaMemoryResource, MemoryResource, PinnedHostMemoryResource, Stream};
use std::sync::Arc;

const MIB: usize = 1 << 20;

fn free(mr: &dyn MemoryResource, ptr: usize, bytes: usize, stream: Stream) {
    // SAFETY: `ptr` came from `mr` with `bytes` and is freed once, after the work using it.
    unsafe { mr.deallocate(ptr, bytes, stream) }.unwrap();
}

/// Host -> device -> host through `ptr` (pinned, `bytes` long), asynchronously on one stream.
fn round_trip(ptr: usize, bytes: usize) {
    let device = CudaMemoryResource::new().unwrap();
    let stream = OwnedStream::new(true).unwrap();
    let d = device.allocate(bytes, stream.stream()).unwrap();
    // SAFETY: `ptr` holds `bytes` bytes of pinned host memory owned by the caller.
    let host = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, bytes) };
    for (i, b) in host.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    // SAFETY: both ranges are live for `bytes`; the stream is synchronized before either is
    // read or freed.
    unsafe { cuda::memcpy_async(d, ptr, bytes, stream.stream()) }.unwrap();
    stream.synchronize().unwrap();
    host.fill(0);
    // SAFETY: as above.
    unsafe { cuda::memcpy_async(ptr, d, bytes, stream.stream()) }.unwrap();
    stream.synchronize().unwrap();
    assert!(host.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    free(&device, d, bytes, stream.stream());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_large_allocation_is_registered_on_the_gpus_node_and_copies() {
    let mr = PinnedHostMemoryResource::new().unwrap();
    let bytes = 64 * MIB;
    let p = mr.allocate(bytes, Stream::DEFAULT).unwrap();
    // Registered: CUDA knows the range, exactly.
    assert_eq!(
        cuda::allocation_range(p).map(|(_, b)| b >= bytes),
        Some(true)
    );
    let node = numa_node_of(p);
    let nodes = numa_node_count();
    eprintln!(
        "driver's host NUMA node of device {}: {:?}; pages on node {node:?}; {nodes} node(s)",
        mr.device(),
        mr.numa_node()
    );
    match mr.numa_node() {
        Some(want) => assert_eq!(node, Some(want)),
        None if nodes == 1 => assert_eq!(node, Some(0), "one node: every page is on node 0"),
        None => {}
    }
    round_trip(p, bytes);
    free(&mr, p, bytes, Stream::DEFAULT);
    // A small one comes from cuMemHostAlloc and copies too.
    let q = mr.allocate(MIB, Stream::DEFAULT).unwrap();
    assert!(cuda::allocation_range(q).is_some());
    round_trip(q, MIB);
    free(&mr, q, MIB, Stream::DEFAULT);
    // Every allocation from cuMemHostAlloc when asked.
    let all_alloc = PinnedHostMemoryResource::with_options(PinnedOptions {
        registered_from: usize::MAX,
        ..PinnedOptions::default()
    })
    .unwrap();
    let r = all_alloc.allocate(bytes, Stream::DEFAULT).unwrap();
    round_trip(r, bytes);
    free(&all_alloc, r, bytes, Stream::DEFAULT);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_expandable_pinned_pool_keeps_one_registration_per_run_and_copies_across_growth() {
    let page = 32 * MIB;
    let vm = Arc::new(
        HostVirtualMemory::new(1024 * MIB, Some(page), true, cuda::host_numa_node(0)).unwrap(),
    );
    let pool = ExpandableMemoryResource::new(
        vm.clone(),
        ExpandableSizes {
            initial_pool_size: Some(0),
            ..Default::default()
        },
    )
    .unwrap();
    let a = pool.allocate(40 * MIB, Stream::DEFAULT).unwrap();
    let b = pool.allocate(40 * MIB, Stream::DEFAULT).unwrap();
    assert_eq!(
        vm.runs().len(),
        1,
        "growth joins the registration: {:?}",
        vm.runs()
    );
    let (start, len) = vm.runs()[0];
    assert_eq!(cuda::allocation_range(a), Some((start, len)));
    round_trip(a, 40 * MIB);
    round_trip(b, 40 * MIB);
    free(&pool, a, 40 * MIB, Stream::DEFAULT);
    pool.trim(0).unwrap();
    // What is still live is still registered and copies.
    assert!(vm.runs().iter().all(|&(s, l)| s <= b && b < s + l));
    round_trip(b, 40 * MIB);
    free(&pool, b, 40 * MIB, Stream::DEFAULT);
    pool.trim(0).unwrap();
    assert_eq!(vm.mapped_bytes(), 0);
}

/// Issue 29: a pinned pool larger than the host is a MemoryError before anything is touched
/// (it faulted pages in until the kernel killed the process), and the process keeps working;
/// the start-up breakdown of a pinned allocation is recorded.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_pinned_pool_larger_than_the_host_is_refused_and_startup_is_recorded() {
    use rrmm::os::host_pages::available_host_memory;
    let room = available_host_memory().unwrap();
    let too_much = (room.available + (4 << 30)).next_multiple_of(2 * MIB);
    // No range kept from an earlier test: this one's start-up makes its pages.
    rrmm::resource::host_pages::registered::supply().give_back(0);
    let pinned = Arc::new(PinnedHostMemoryResource::new().unwrap());
    let up: rrmm::SharedResource = pinned.clone();
    let e = rrmm::PoolMemoryResource::new(up.clone(), Some(too_much), None).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert!(e.to_string().contains("bytes available"), "{e}");
    let pool = rrmm::PoolMemoryResource::new(up, Some(64 * MIB), None).unwrap();
    let p = pool.allocate(MIB, Stream::DEFAULT).unwrap();
    free(&pool, p, MIB, Stream::DEFAULT);
    let s = pinned.last_startup().unwrap();
    assert_eq!(s.bytes, 64 * MIB);
    assert!(s.touch_threads >= 1 && s.total_s >= s.touch_s && s.total_s >= s.register_s);
    eprintln!("{s:?}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_freed_registered_range_is_kept_registered_for_the_next_user() {
    let supply = rrmm::resource::host_pages::registered::supply();
    supply.give_back(0);
    let mr = PinnedHostMemoryResource::new().unwrap();
    let bytes = 64 * MIB;
    let p = mr.allocate(bytes, Stream::DEFAULT).unwrap();
    assert!(!mr.last_startup().unwrap().from_supply);
    free(&mr, p, bytes, Stream::DEFAULT);
    // Kept in the process's host page supply, still registered.
    assert_eq!(supply.figures().free_bytes, bytes);
    let q = mr.allocate(bytes, Stream::DEFAULT).unwrap();
    let s = mr.last_startup().unwrap();
    assert!(s.from_supply && s.total_s < 0.1, "{s:?}");
    assert_eq!(q, p, "the same range, ready");
    assert_eq!(
        cuda::allocation_range(q).map(|(_, b)| b >= bytes),
        Some(true)
    );
    round_trip(q, bytes);
    free(&mr, q, bytes, Stream::DEFAULT);
    assert_eq!(supply.give_back(0), bytes);
}
