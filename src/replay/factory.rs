//! Building the resources that `rrmm replay` compares, by name.

use crate::cuda::Stream;
use crate::error::{Error, Result};
use crate::resource::{
    CudaAsyncMemoryResource, CudaMemoryResource, Footprint, ManagedMemoryResource, MemoryKind,
    MemoryResource, SharedResource, SimulatedMemoryResource,
};
use crate::suballocator::{
    ArenaMemoryResource, BinningMemoryResource, FixedSizeMemoryResource, PoolMemoryResource,
    DEFAULT_BLOCKS_TO_PREALLOCATE, DEFAULT_BLOCK_SIZE,
};
use std::sync::Arc;

/// Smallest bin of `binning`: 2^18 bytes (benchmarks.md W1).
const BINNING_MIN_EXPONENT: u32 = 18;
/// Largest bin of `binning`: 2^22 bytes.
const BINNING_MAX_EXPONENT: u32 = 22;

/// The resource names [`build_resource`] knows, in the order `--compare all` uses.
pub const RESOURCE_NAMES: &[&str] = &[
    "pool",
    "binning",
    "arena",
    "fixed_size",
    "cuda_async",
    "cuda",
    "managed",
    "simulated",
];

/// Names that need the suballocators (pool, binning, fixed_size).
const SUBALLOCATORS: &[&str] = &["pool", "binning", "arena", "fixed_size"];

/// Builds the resource `name` for a replay: over simulated memory of `simulate` bytes when
/// given, else over real CUDA memory of the current device.
///
/// - `cuda`, `simulated`: the device itself (`cuMemAlloc`, or the simulated device);
/// - `cuda_async`, `managed`: CUDA's stream-ordered pool, managed memory (on simulated memory,
///   the simulated device stands in for both);
/// - `pool`: a pool with `initial_pool_size`/`maximum_pool_size` over the device;
/// - `binning`: fixed-size bins of 2^18..2^22 bytes over a pool, larger requests to the pool
///   (benchmarks.md W1); its footprint is the pool's;
/// - `arena`: an arena of half the device's free memory over the device (see
///   [`build_resource_sized`] for another size);
/// - `fixed_size`: 1 MiB blocks, 128 preallocated, over the device.
///
/// Resources without a pool ignore the pool sizes.
///
/// # Errors
/// [`Error::InvalidArgument`] for an unknown name; CUDA errors (no driver) for real memory; the pool's validation of its sizes.
pub fn build_resource(
    name: &str,
    simulate: Option<usize>,
    initial_pool_size: Option<usize>,
    maximum_pool_size: Option<usize>,
) -> Result<SharedResource> {
    build_resource_sized(name, simulate, initial_pool_size, maximum_pool_size, None)
}

/// As [`build_resource`], with the arena's size for `arena` (default: half the free memory);
/// other resources ignore it.
///
/// # Errors
/// As [`build_resource`]; the arena's validation of its size.
pub fn build_resource_sized(
    name: &str,
    simulate: Option<usize>,
    initial_pool_size: Option<usize>,
    maximum_pool_size: Option<usize>,
    arena_size: Option<usize>,
) -> Result<SharedResource> {
    let name = name.trim().to_ascii_lowercase().replace('-', "_");
    if !RESOURCE_NAMES.contains(&name.as_str()) {
        return Err(Error::invalid(
            "resource",
            format!(
                "unknown resource {name:?}; known: {}",
                RESOURCE_NAMES.join(", ")
            ),
        ));
    }
    // Pool sizes shape the pool of `pool` and `binning`; the other resources hold no pool and
    // ignore them, so one command line can compare every resource.
    let device = || -> Result<SharedResource> {
        match simulate {
            Some(size) => Ok(Arc::new(SimulatedMemoryResource::new(size))),
            None => Ok(Arc::new(CudaMemoryResource::new()?)),
        }
    };
    match name.as_str() {
        "simulated" => match simulate {
            Some(size) => Ok(Arc::new(SimulatedMemoryResource::new(size))),
            None => Err(Error::invalid(
                "resource",
                "simulated needs a size (--simulate SIZE)",
            )),
        },
        "cuda" => device(),
        "cuda_async" => match simulate {
            Some(_) => device(),
            None => Ok(Arc::new(CudaAsyncMemoryResource::new(
                None,
                None,
                crate::cuda::PoolExport {
                    ipc: false,
                    fabric: false,
                },
            )?)),
        },
        "managed" => match simulate {
            Some(_) => device(),
            None => Ok(Arc::new(ManagedMemoryResource::new()?)),
        },
        sub if SUBALLOCATORS.contains(&sub) => {
            if sub == "arena" {
                return Ok(Arc::new(ArenaMemoryResource::new(
                    device()?,
                    arena_size,
                    false,
                )?));
            }
            build_suballocator(sub, device()?, initial_pool_size, maximum_pool_size)
        }
        _ => Err(Error::invalid(
            "resource",
            format!("unknown resource {name:?}"),
        )),
    }
}

/// The suballocators over `upstream` (the device or simulated memory).
fn build_suballocator(
    name: &str,
    upstream: SharedResource,
    initial_pool_size: Option<usize>,
    maximum_pool_size: Option<usize>,
) -> Result<SharedResource> {
    let pool = |upstream| -> Result<SharedResource> {
        Ok(Arc::new(PoolMemoryResource::new(
            upstream,
            initial_pool_size,
            maximum_pool_size,
        )?))
    };
    match name {
        "pool" => pool(upstream),
        "binning" => {
            let pool = pool(upstream)?;
            let binning = BinningMemoryResource::new(
                pool.clone(),
                Some(BINNING_MIN_EXPONENT),
                Some(BINNING_MAX_EXPONENT),
            )?;
            Ok(Arc::new(PoolFootprint {
                resource: Arc::new(binning),
                pool,
            }))
        }
        _ => Ok(Arc::new(FixedSizeMemoryResource::new(
            upstream,
            DEFAULT_BLOCK_SIZE,
            DEFAULT_BLOCKS_TO_PREALLOCATE,
        )?)),
    }
}

/// A binning resource over a pool that reports the pool's footprint: the pool holds all the
/// memory (the bins' chunks and the large requests), while the binning resource's own footprint
/// covers only its bins.
struct PoolFootprint {
    resource: SharedResource,
    pool: SharedResource,
}

impl MemoryResource for PoolFootprint {
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        self.resource.allocate(bytes, stream)
    }
    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        // SAFETY: the caller's contract, forwarded to the wrapped resource that allocated `ptr`.
        unsafe { self.resource.deallocate(ptr, bytes, stream) }
    }
    fn kind(&self) -> MemoryKind {
        self.resource.kind()
    }
    fn device(&self) -> Option<usize> {
        self.resource.device()
    }
    fn memory_info(&self) -> Option<(usize, usize)> {
        self.resource.memory_info()
    }
    fn footprint(&self) -> Option<Footprint> {
        self.pool.footprint()
    }
    fn name(&self) -> &'static str {
        self.resource.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_simulated_resources_and_rejects_bad_names() {
        for name in ["cuda", "cuda_async", "managed", "simulated", "CUDA-Async"] {
            let mr = build_resource(name, Some(1 << 20), None, None).unwrap();
            assert_eq!(mr.name(), "simulated");
        }
        assert!(build_resource("nope", Some(1), None, None).is_err());
        // Resources without a pool ignore the pool sizes, so one command line compares all.
        assert!(build_resource("cuda", Some(1 << 20), Some(1), None).is_ok());
        assert!(build_resource("simulated", None, None, None).is_err());
    }

    #[test]
    fn builds_suballocators_over_simulated_memory() {
        let pool = build_resource("pool", Some(1 << 30), Some(1 << 20), Some(1 << 29)).unwrap();
        assert_eq!(pool.name(), "pool");
        assert_eq!(pool.footprint().unwrap().held_bytes, 1 << 20);
        let binning = build_resource("binning", Some(1 << 30), Some(1 << 20), None).unwrap();
        assert_eq!(binning.name(), "binning");
        let arena = build_resource("arena", Some(1 << 30), Some(1 << 20), None).unwrap();
        assert_eq!(arena.name(), "arena");
        assert_eq!(
            arena.footprint().unwrap().held_bytes,
            1 << 29,
            "pool sizes ignored"
        );
        let sized = build_resource_sized("arena", Some(1 << 30), None, None, Some(1 << 24));
        assert_eq!(sized.unwrap().footprint().unwrap().held_bytes, 1 << 24);
        assert!(build_resource_sized("arena", Some(1 << 30), None, None, Some(4096)).is_err());
        let fixed = build_resource("fixed_size", Some(1 << 30), None, None).unwrap();
        assert_eq!(fixed.name(), "fixed_size");
        // RMM's validation of pool sizes comes through.
        assert!(build_resource("pool", Some(1 << 30), Some(1000), None).is_err());
        assert!(build_resource("binning", Some(1 << 30), Some(1000), None).is_err());
        assert!(build_resource("fixed_size", Some(1 << 30), Some(1000), None).is_ok());
    }
}
