//! Building the resources that `rrmm replay` compares, by name.

use crate::error::{Error, Result};
use crate::resource::{
    CudaAsyncMemoryResource, CudaMemoryResource, ManagedMemoryResource, SharedResource,
    SimulatedMemoryResource,
};
use std::sync::Arc;

/// The resource names [`build_resource`] knows, in the order `--compare all` uses.
pub const RESOURCE_NAMES: &[&str] = &[
    "pool",
    "binning",
    "fixed_size",
    "cuda_async",
    "cuda",
    "managed",
    "simulated",
];

/// Names that need the suballocators (pool, binning, fixed_size).
const SUBALLOCATORS: &[&str] = &["pool", "binning", "fixed_size"];

/// Builds the resource `name` for a replay: over simulated memory of `simulate` bytes when
/// given, else over real CUDA memory of the current device.
///
/// - `cuda`, `simulated`: the device itself (`cuMemAlloc`, or the simulated device);
/// - `cuda_async`, `managed`: CUDA's stream-ordered pool, managed memory (on simulated memory,
///   the simulated device stands in for both);
/// - `pool`: a pool with `initial_pool_size`/`maximum_pool_size` over the device;
/// - `binning`: fixed-size bins of 2^18..2^22 bytes over a pool, larger requests to the pool
///   (benchmarks.md W1);
/// - `fixed_size`: 1 MiB blocks, 128 preallocated, over the device.
///
/// # Errors
/// [`Error::InvalidArgument`] for an unknown name, or pool sizes given to a resource that has
/// no pool; CUDA errors (no driver) for real memory; the pool's validation of its sizes.
pub fn build_resource(
    name: &str,
    simulate: Option<usize>,
    initial_pool_size: Option<usize>,
    maximum_pool_size: Option<usize>,
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
    let pooled = matches!(name.as_str(), "pool" | "binning");
    if !pooled && (initial_pool_size.is_some() || maximum_pool_size.is_some()) {
        return Err(Error::invalid(
            "initial_pool_size",
            format!("pool sizes apply to pool and binning, not to {name}"),
        ));
    }
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
            build_suballocator(sub, device()?, initial_pool_size, maximum_pool_size)
        }
        _ => Err(Error::invalid(
            "resource",
            format!("unknown resource {name:?}"),
        )),
    }
}

/// The suballocators over `upstream`; they come from `crate::suballocator` (branch `pool`).
fn build_suballocator(
    name: &str,
    _upstream: SharedResource,
    _initial_pool_size: Option<usize>,
    _maximum_pool_size: Option<usize>,
) -> Result<SharedResource> {
    Err(Error::invalid(
        "resource",
        format!("{name} is not available in this build yet"),
    ))
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
        assert!(build_resource("cuda", Some(1 << 20), Some(1), None).is_err());
        assert!(build_resource("simulated", None, None, None).is_err());
    }
}
