//! What the GPU test binaries share: the CUDA upstream and the multi-thread data hammer.

#![allow(dead_code)] // each test binary uses its own part

use rrmm::cuda::{self, OwnedStream};
use rrmm::{CudaMemoryResource, MemoryResource, SharedResource, Stream};
use std::sync::Arc;

/// A tiny deterministic generator (xorshift) so the tests need no extra crates.
pub struct Rng(pub u64);
impl Rng {
    /// The next number.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Device memory straight from the driver on device 0.
pub fn cuda_upstream() -> SharedResource {
    Arc::new(CudaMemoryResource::new().expect("a CUDA device"))
}

/// `threads` threads, thread t on the per-thread default stream when `ptds(t)`, else on its own
/// non-blocking stream, allocating 1..max_size bytes (at most 16 live), filling each with the
/// thread's byte and checking an allocation's bytes before freeing it now and then.
pub fn hammer(
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
