//! GPU tests of the pool, fixed-size and binning resources on real memory: data integrity under
//! allocation and free on several streams and threads, and out-of-memory at the maximum. They
//! need a CUDA GPU and are ignored elsewhere (`cargo test -- --ignored`).

use rrmm::cuda::{self, OwnedStream};
use rrmm::suballocator::{BinningMemoryResource, FixedSizeMemoryResource, PoolMemoryResource};
use rrmm::{CudaMemoryResource, MemoryResource, SharedResource, Stream};
use std::sync::Arc;

fn cuda_upstream() -> SharedResource {
    Arc::new(CudaMemoryResource::new().expect("a CUDA device"))
}

/// A tiny deterministic generator (xorshift) so the tests need no extra crates.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Each thread allocates on its own stream, fills each allocation with its own byte on that
/// stream, and checks a live allocation's bytes now and then; overlapping or prematurely reused
/// memory shows up as foreign bytes.
fn hammer(mr: SharedResource, threads: usize, rounds: usize, max_size: u64) {
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let mr = mr.clone();
            std::thread::spawn(move || {
                let _ctx = cuda::ContextGuard::new(0).unwrap();
                let own = OwnedStream::new(true).unwrap();
                let stream = if t == 0 {
                    Stream::PER_THREAD
                } else {
                    own.stream()
                };
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (t as u64 + 1));
                let mut live: Vec<(usize, usize, u8)> = Vec::new();
                for round in 0..rounds {
                    if live.len() < 16 && rng.next() % 3 != 0 {
                        let size = 1 + (rng.next() % max_size) as usize;
                        let ptr = mr.allocate(size, stream).unwrap();
                        assert_eq!(ptr % 256, 0);
                        let value = (t * 16 + round % 16) as u8 | 1;
                        // SAFETY: `size` bytes were just allocated at `ptr`.
                        unsafe { cuda::memset_async(ptr, value, size, stream).unwrap() };
                        live.push((ptr, size, value));
                    } else if !live.is_empty() {
                        let i = (rng.next() % live.len() as u64) as usize;
                        let (ptr, size, value) = live.swap_remove(i);
                        if round % 5 == 0 {
                            let mut host = vec![0u8; size];
                            // SAFETY: the allocation is live and holds `size` bytes.
                            unsafe {
                                cuda::memcpy_sync(host.as_mut_ptr() as usize, ptr, size, stream)
                                    .unwrap()
                            };
                            assert!(host.iter().all(|&b| b == value), "thread {t}: corrupted");
                        }
                        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
                        unsafe { mr.deallocate(ptr, size, stream) }.unwrap();
                    }
                }
                for (ptr, size, _) in live {
                    // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
                    unsafe { mr.deallocate(ptr, size, stream) }.unwrap();
                }
                stream.synchronize().unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a thread failed");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn pool_keeps_data_intact_across_streams_and_threads() {
    let pool = PoolMemoryResource::new(cuda_upstream(), Some(256 << 20), Some(2 << 30)).unwrap();
    hammer(Arc::new(pool.clone()), 6, 600, 1 << 20);
    assert!(pool.pool_size() >= 256 << 20);
    pool.release().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fixed_size_and_binning_keep_data_intact() {
    let fixed = FixedSizeMemoryResource::new(cuda_upstream(), 1 << 20, 16).unwrap();
    hammer(Arc::new(fixed), 4, 400, 1 << 20);
    let pool: SharedResource =
        Arc::new(PoolMemoryResource::new(cuda_upstream(), Some(256 << 20), None).unwrap());
    let binning = BinningMemoryResource::new(pool, Some(18), Some(22)).unwrap();
    hammer(Arc::new(binning), 4, 400, 8 << 20);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn pool_out_of_memory_at_the_maximum_then_still_works() {
    let pool = PoolMemoryResource::new(cuda_upstream(), Some(32 << 20), Some(64 << 20)).unwrap();
    let a = pool.allocate(40 << 20, Stream::DEFAULT).unwrap();
    let err = pool.allocate(40 << 20, Stream::DEFAULT).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
    unsafe { pool.deallocate(a, 40 << 20, Stream::DEFAULT) }.unwrap();
    let _ctx = cuda::ContextGuard::new(0).unwrap();
    let b = pool.allocate(60 << 20, Stream::DEFAULT).unwrap();
    let mut host = vec![0u8; 4096];
    // SAFETY: `b` holds 60 MiB.
    unsafe {
        cuda::memset_async(b, 0x5a, 60 << 20, Stream::DEFAULT).unwrap();
        cuda::memcpy_sync(host.as_mut_ptr() as usize, b, 4096, Stream::DEFAULT).unwrap();
    }
    assert!(host.iter().all(|&x| x == 0x5a));
    // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
    unsafe { pool.deallocate(b, 60 << 20, Stream::DEFAULT) }.unwrap();
}
