//! GPU tests of the arena (and, at 16 threads, the pool and binning): each thread on its own
//! stream or its per-thread default stream writes a byte pattern into every allocation and checks
//! it; exhaustion then recovery; a large block freed on a default stream while a kernel still
//! writes it, reused by another stream only after that kernel; the spin kernel. They need a CUDA
//! GPU and are ignored elsewhere (`cargo test --test gpu_arena -- --ignored`).

use rrmm::cuda::{self, OwnedStream, SpinKernel};
use rrmm::suballocator::{ArenaMemoryResource, BinningMemoryResource, PoolMemoryResource};
use rrmm::{DeviceBuffer, MemoryResource, SharedResource, Stream};
use std::sync::Arc;

mod common;
use common::{cuda_upstream, hammer};

const MIB: usize = 1 << 20;

#[test]
#[ignore = "needs a CUDA GPU"]
fn arena_keeps_data_intact_on_16_streams_and_per_thread_default_streams() {
    let arena = ArenaMemoryResource::new(cuda_upstream(), Some(1 << 30), false).unwrap();
    hammer(Arc::new(arena.clone()), 16, 600, 2 << 20, |_| false);
    hammer(Arc::new(arena.clone()), 8, 600, 2 << 20, |_| true);
    hammer(Arc::new(arena.clone()), 8, 600, 512 << 10, |t| t % 2 == 0);
    assert_eq!(arena.free_bytes(), 1 << 30);
    arena.defragment().unwrap();
    assert_eq!(arena.global_free_bytes(), 1 << 30);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn pool_and_binning_keep_data_intact_on_16_streams() {
    let pool = PoolMemoryResource::new(cuda_upstream(), Some(256 << 20), None).unwrap();
    hammer(Arc::new(pool.clone()), 16, 600, 1 << 20, |_| false);
    let binning = BinningMemoryResource::new(Arc::new(pool), Some(18), Some(22)).unwrap();
    hammer(Arc::new(binning), 16, 600, 8 << 20, |t| t % 4 == 0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn arena_exhaustion_is_out_of_memory_then_the_arena_works() {
    let arena = ArenaMemoryResource::new(cuda_upstream(), Some(64 * MIB), false).unwrap();
    let _ctx = cuda::ContextGuard::new(0).unwrap();
    let s = OwnedStream::new(true).unwrap();
    let a = arena.allocate(40 * MIB, s.stream()).unwrap();
    let err = arena.allocate(40 * MIB, Stream::PER_THREAD).unwrap_err();
    assert!(
        err.is_out_of_memory() && err.to_string().contains("No room in arena."),
        "{err}"
    );
    // SAFETY: live, this size, freed once; no work uses it.
    unsafe { arena.deallocate(a, 40 * MIB, s.stream()) }.unwrap();
    let b = arena.allocate(64 * MIB, Stream::PER_THREAD).unwrap();
    let mut host = vec![0u8; 4096];
    // SAFETY: `b` holds 64 MiB.
    unsafe {
        cuda::memset_async(b, 0x5a, 64 * MIB, Stream::PER_THREAD).unwrap();
        cuda::memcpy_sync(
            host.as_mut_ptr() as usize,
            b + 60 * MIB,
            4096,
            Stream::PER_THREAD,
        )
        .unwrap();
    }
    assert!(host.iter().all(|&x| x == 0x5a));
    // SAFETY: live, this size, freed once; the copy above synchronized the stream.
    unsafe { arena.deallocate(b, 64 * MIB, Stream::PER_THREAD) }.unwrap();
}

/// Frees a large block on `freer` while a spinning kernel on `freer` is still to write into it,
/// then takes the same range on a non-blocking stream and clears it there: the kernel's late
/// write must land before the clearing, so the block reads as cleared once everything is done.
fn large_block_reuse_waits_for_the_freeing_stream(freer: Stream) {
    let kernel = SpinKernel::new(0).unwrap();
    let _ctx = cuda::ContextGuard::new(0).unwrap();
    let arena = ArenaMemoryResource::new(cuda_upstream(), Some(64 * MIB), false).unwrap();
    let mr: SharedResource = Arc::new(arena.clone());
    let s = OwnedStream::new(true).unwrap();
    for round in 0..4 {
        let buf = DeviceBuffer::new(4 * MIB, freer, mr.clone()).unwrap();
        let ptr = buf.ptr();
        // About 50 ms at H200 clocks: far longer than the host takes to reach the clearing.
        kernel.launch(100_000_000, &buf).unwrap();
        drop(buf); // freed on `freer`, the kernel still running
        let again = arena.allocate(4 * MIB, s.stream()).unwrap();
        assert_eq!(
            again, ptr,
            "round {round}: the same range, or the test proves nothing"
        );
        let mut host = [0xffu8; 8];
        // SAFETY: `again` holds 4 MiB; the context synchronisation ends all work before the
        // copy reads it back.
        unsafe {
            cuda::memset_async(again, 0, 8, s.stream()).unwrap();
            cuda::context_synchronize().unwrap();
            cuda::memcpy_sync(host.as_mut_ptr() as usize, again, 8, s.stream()).unwrap();
        }
        assert_eq!(
            host, [0; 8],
            "round {round}: the kernel wrote after the reuse"
        );
        // SAFETY: live, this size, freed once; the work on it is done.
        unsafe { arena.deallocate(again, 4 * MIB, s.stream()) }.unwrap();
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_large_block_freed_on_the_legacy_stream_is_reused_elsewhere_after_its_work() {
    large_block_reuse_waits_for_the_freeing_stream(Stream::DEFAULT);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_large_block_freed_on_the_per_thread_stream_is_reused_elsewhere_after_its_work() {
    large_block_reuse_waits_for_the_freeing_stream(Stream::PER_THREAD);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn spin_kernel_writes_its_start_clock_on_each_stream() {
    let kernel = SpinKernel::new(0).unwrap();
    let _ctx = cuda::ContextGuard::new(0).unwrap();
    let mr: SharedResource =
        Arc::new(ArenaMemoryResource::new(cuda_upstream(), Some(64 * MIB), false).unwrap());
    let streams: Vec<OwnedStream> = (0..4).map(|_| OwnedStream::new(true).unwrap()).collect();
    let bufs: Vec<DeviceBuffer> = streams
        .iter()
        .map(|s| {
            let buf = DeviceBuffer::from_host(&[0u8; 8], s.stream(), mr.clone()).unwrap();
            kernel.launch(100_000, &buf).unwrap();
            buf
        })
        .collect();
    for buf in &bufs {
        let clock = u64::from_le_bytes(buf.to_vec().unwrap()[..8].try_into().unwrap());
        assert_ne!(clock, 0, "the kernel ran and wrote its start clock");
    }
    let small = DeviceBuffer::new(4, Stream::DEFAULT, mr.clone()).unwrap();
    assert!(
        kernel.launch(10, &small).is_err(),
        "too small for the kernel's write"
    );
    kernel.spin(1000, Stream::DEFAULT).unwrap();
    Stream::DEFAULT.synchronize().unwrap();
}
