//! GPU tests of the arena (and, at 16 threads, the pool and binning): each thread on its own
//! stream or its per-thread default stream writes a byte pattern into every allocation and checks
//! it; exhaustion then recovery; the spin kernel. They need a CUDA GPU and are ignored elsewhere
//! (`cargo test --test gpu_arena -- --ignored`).

use rrmm::cuda::{self, OwnedStream, SpinKernel};
use rrmm::suballocator::{ArenaMemoryResource, BinningMemoryResource, PoolMemoryResource};
use rrmm::{CudaMemoryResource, DeviceBuffer, MemoryResource, SharedResource, Stream};
use std::sync::Arc;

const MIB: usize = 1 << 20;

fn cuda_upstream() -> SharedResource {
    Arc::new(CudaMemoryResource::new().expect("a CUDA device"))
}

/// `threads` threads, thread t on the per-thread default stream when `ptds(t)`, else on its own
/// non-blocking stream, allocating 1..max_size bytes (at most 16 live), filling each with the
/// thread's byte and checking an allocation's bytes before freeing it now and then.
fn hammer(
    mr: SharedResource,
    threads: usize,
    rounds: usize,
    max_size: u64,
    ptds: fn(usize) -> bool,
) {
    std::thread::scope(|scope| {
        for t in 0..threads {
            let mr = mr.clone();
            scope.spawn(move || {
                let _ctx = cuda::ContextGuard::new(0).unwrap();
                let own = OwnedStream::new(true).unwrap();
                let stream = if ptds(t) {
                    Stream::PER_THREAD
                } else {
                    own.stream()
                };
                let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (t as u64 + 1);
                let mut next = move || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                let mut live: Vec<(usize, usize, u8)> = Vec::new();
                for round in 0..rounds {
                    if live.len() < 16 && next() % 3 != 0 {
                        let size = 1 + (next() % max_size) as usize;
                        let ptr = mr.allocate(size, stream).unwrap();
                        assert_eq!(ptr % 256, 0);
                        let value = (t * 16 + round % 16) as u8 | 1;
                        // SAFETY: `size` bytes were just allocated at `ptr`.
                        unsafe { cuda::memset_async(ptr, value, size, stream).unwrap() };
                        live.push((ptr, size, value));
                    } else if !live.is_empty() {
                        let i = (next() % live.len() as u64) as usize;
                        let (ptr, size, value) = live.swap_remove(i);
                        if round % 3 == 0 {
                            let mut host = vec![0u8; size];
                            // SAFETY: the allocation is live and holds `size` bytes.
                            unsafe {
                                cuda::memcpy_sync(host.as_mut_ptr() as usize, ptr, size, stream)
                                    .unwrap()
                            };
                            assert!(host.iter().all(|&b| b == value), "thread {t}: corrupted");
                        }
                        // SAFETY: a live allocation of this size, freed once; the check above
                        // synchronized, and later work on it is ordered on the same stream.
                        unsafe { mr.deallocate(ptr, size, stream) }.unwrap();
                    }
                }
                for (ptr, size, _) in live {
                    // SAFETY: a live allocation of this size, freed once, on its stream.
                    unsafe { mr.deallocate(ptr, size, stream) }.unwrap();
                }
                stream.synchronize().unwrap();
            });
        }
    });
}

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
