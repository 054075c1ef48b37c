//! The pool near a full device (issue 28): a driver that refuses exactly its free figure (as
//! CUDA does: it keeps some memory for itself) must not make the pool take half of what is left
//! at each growth, leaving tails that later requests cannot use.

use rrmm::{
    Error, MemoryKind, MemoryResource, PoolMemoryResource, Result, SharedResource,
    SimulatedMemoryResource, Stream,
};
use std::sync::Arc;

const GIB: usize = 1 << 30;
const MIB: usize = 1 << 20;

/// A simulated device whose allocations fail when they would leave less than `reserve` free.
#[derive(Debug)]
struct Reserving {
    device: SimulatedMemoryResource,
    reserve: usize,
}

impl MemoryResource for Reserving {
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        let (free, _) = self
            .device
            .memory_info()
            .expect("simulated memory reports it");
        if bytes.saturating_add(self.reserve) > free {
            return Err(Error::out_of_memory(
                bytes,
                String::from("reserved by the driver"),
            ));
        }
        self.device.allocate(bytes, stream)
    }

    #[allow(unsafe_code)]
    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.device.deallocate(ptr, bytes, stream) }
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Simulated
    }

    fn memory_info(&self) -> Option<(usize, usize)> {
        self.device.memory_info()
    }

    fn name(&self) -> &'static str {
        "reserving"
    }
}

/// The sequence at the scale of an 80 GB device: 35 arrays of 2 GiB (each followed by
/// a reduction's small temporaries, one kept), then 4 GiB: served, as RMM serves it.
#[test]
fn a_4_gib_array_after_35_of_2_gib_is_served_near_a_full_device() {
    let device: SharedResource = Arc::new(Reserving {
        device: SimulatedMemoryResource::new(81_559 * MIB),
        reserve: 300 * MIB,
    });
    let pool = PoolMemoryResource::new(device, None, None).expect("pool");
    let mut live = Vec::new();
    for _ in 0..35 {
        live.push((
            pool.allocate(2 * GIB, Stream::DEFAULT).expect("2 GiB"),
            2 * GIB,
        ));
        let temp = pool.allocate(8 * MIB, Stream::DEFAULT).expect("temporary");
        live.push((pool.allocate(256, Stream::DEFAULT).expect("result"), 256));
        // SAFETY: allocated just above with this size, freed once, unused.
        #[allow(unsafe_code)]
        unsafe { pool.deallocate(temp, 8 * MIB, Stream::DEFAULT) }.expect("free");
    }
    let big = pool.allocate(4 * GIB, Stream::DEFAULT);
    assert!(
        big.is_ok(),
        "4 GiB refused: pool {} B in {} chunks, {} B free in {} blocks, largest {}: {:?}",
        pool.pool_size(),
        pool.upstream_chunk_count(),
        pool.free_bytes(),
        pool.free_block_count(),
        pool.largest_free_block(),
        big.err()
    );
    assert!(
        pool.upstream_chunk_count() <= 3,
        "{} chunks",
        pool.upstream_chunk_count()
    );
}
