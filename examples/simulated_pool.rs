//! A pool over a simulated 80 GiB GPU (no GPU needed): will this allocation pattern fit, and
//! what does the pool hold? Then typed containers over host memory, copied both ways.
//!
//! `cargo run --example simulated_pool`

use rrmm::suballocator::PoolMemoryResource;
use rrmm::{
    DeviceRagged, DeviceUVector, MemoryResource, SharedResource, SimulatedMemoryResource, Stream,
    SystemMemoryResource,
};
use std::sync::Arc;

const GIB: usize = 1 << 30;

fn main() -> rrmm::Result<()> {
    let device: SharedResource = Arc::new(SimulatedMemoryResource::new(80 * GIB));
    let pool = PoolMemoryResource::new(device, Some(8 * GIB), None)?;
    let mut live = Vec::new();
    for i in 0..64 {
        let bytes = ((i % 8 + 1) * 256) << 20;
        live.push((pool.allocate(bytes, Stream::DEFAULT)?, bytes));
    }
    println!(
        "64 allocations, {:.2} GiB in use: the pool holds {:.2} GiB",
        live.iter().map(|&(_, b)| b).sum::<usize>() as f64 / GIB as f64,
        pool.pool_size() as f64 / GIB as f64
    );
    for (ptr, bytes) in live {
        // SAFETY: allocated above with `bytes`, freed once; simulated memory is never touched.
        unsafe { pool.deallocate(ptr, bytes, Stream::DEFAULT) }?;
    }

    // Typed containers work over any resource; host memory lets them copy without a GPU.
    let host: SharedResource = Arc::new(SystemMemoryResource::new());
    let mut v = DeviceUVector::from_host(&[1.0f32, 2.0, 3.0], Stream::DEFAULT, host.clone())?;
    v.resize(5)?;
    v.set_element(4, 5.0)?;
    println!("vector: len {}, element 4 = {}", v.len(), v.element(4)?);
    let rows = vec![vec![1u32, 2], vec![], vec![3, 4, 5]];
    let ragged = DeviceRagged::from_host(&rows, Stream::DEFAULT, host)?;
    assert_eq!(ragged.to_host()?, rows);
    println!(
        "ragged: {} rows, {} values, row 2 = {:?}",
        ragged.rows(),
        ragged.total_len(),
        ragged.row(2)?
    );
    Ok(())
}
