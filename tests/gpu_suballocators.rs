//! GPU tests of the pool, fixed-size and binning resources on real memory: data integrity under
//! allocation and free on several streams and threads, and out-of-memory at the maximum. They
//! need a CUDA GPU and are ignored elsewhere (`cargo test -- --ignored`).

use rrmm::cuda;
use rrmm::suballocator::{BinningMemoryResource, FixedSizeMemoryResource, PoolMemoryResource};
use rrmm::{MemoryResource, SharedResource, Stream};
use std::sync::Arc;

mod common;
use common::{cuda_upstream, hammer};

#[test]
#[ignore = "needs a CUDA GPU"]
fn pool_keeps_data_intact_across_streams_and_threads() {
    let pool = PoolMemoryResource::new(cuda_upstream(), Some(256 << 20), Some(2 << 30)).unwrap();
    hammer(Arc::new(pool.clone()), 6, 600, 1 << 20, |t| t == 0);
    assert!(pool.pool_size() >= 256 << 20);
    pool.release().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fixed_size_and_binning_keep_data_intact() {
    let fixed = FixedSizeMemoryResource::new(cuda_upstream(), 1 << 20, 16).unwrap();
    hammer(Arc::new(fixed), 4, 400, 1 << 20, |t| t == 0);
    let pool: SharedResource =
        Arc::new(PoolMemoryResource::new(cuda_upstream(), Some(256 << 20), None).unwrap());
    let binning = BinningMemoryResource::new(pool, Some(18), Some(22)).unwrap();
    hammer(Arc::new(binning), 4, 400, 8 << 20, |t| t == 0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn pool_out_of_memory_at_the_maximum_then_still_works() {
    let pool = PoolMemoryResource::new(cuda_upstream(), Some(32 << 20), Some(64 << 20)).unwrap();
    let a = pool.allocate(30 << 20, Stream::DEFAULT).unwrap();
    let err = pool.allocate(40 << 20, Stream::DEFAULT).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert_eq!(
        pool.pool_size(),
        32 << 20,
        "a failed request keeps the initial chunk"
    );
    // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
    unsafe { pool.deallocate(a, 30 << 20, Stream::DEFAULT) }.unwrap();
    let _ctx = cuda::ContextGuard::new(0).unwrap();
    let b = pool.allocate(30 << 20, Stream::DEFAULT).unwrap();
    let mut host = vec![0u8; 4096];
    // SAFETY: `b` holds 30 MiB.
    unsafe {
        cuda::memset_async(b, 0x5a, 30 << 20, Stream::DEFAULT).unwrap();
        cuda::memcpy_sync(host.as_mut_ptr() as usize, b, 4096, Stream::DEFAULT).unwrap();
    }
    assert!(host.iter().all(|&x| x == 0x5a));
    // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
    unsafe { pool.deallocate(b, 30 << 20, Stream::DEFAULT) }.unwrap();
}
