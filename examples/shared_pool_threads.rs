//! One pool shared by eight threads (the resources are `Send + Sync`; clones of a pool share
//! it), each allocating and freeing on its own, over simulated memory (no GPU needed).
//!
//! `cargo run --example shared_pool_threads`

use rrmm::suballocator::PoolMemoryResource;
use rrmm::{MemoryResource, SharedResource, SimulatedMemoryResource, Stream};
use std::sync::Arc;

fn main() -> rrmm::Result<()> {
    let device: SharedResource = Arc::new(SimulatedMemoryResource::new(16 << 30));
    let pool = PoolMemoryResource::new(device, Some(1 << 30), None)?;
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let pool = pool.clone();
            std::thread::spawn(move || -> rrmm::Result<usize> {
                let mut done = 0;
                for i in 0..10_000usize {
                    let bytes = 256 * (1 + (i * 7 + t) % 4096);
                    let p = pool.allocate(bytes, Stream::DEFAULT)?;
                    // SAFETY: allocated just above with `bytes`, freed once, never touched.
                    unsafe { pool.deallocate(p, bytes, Stream::DEFAULT) }?;
                    done += 1;
                }
                Ok(done)
            })
        })
        .collect();
    let mut total = 0;
    for h in handles {
        total += h.join().expect("a thread panicked")?;
    }
    println!(
        "{total} allocate/free pairs from 8 threads; pool size {} MiB",
        pool.pool_size() >> 20
    );
    Ok(())
}
