//! Building the resources that `rrmm replay` compares, by name, with their setup described.
//!
//! Each resource is one [`ResourceEntry`] of [`RESOURCES`]: its name, a one-line summary for
//! `--help`, and a function that builds it from [`ResourceOptions`] over the device (real or
//! simulated) and says how it was set up. To add a resource, add one entry.

use crate::error::{Error, Result};
use crate::resource::{
    CudaAsyncMemoryResource, CudaMemoryResource, ManagedMemoryResource, SharedResource,
    SimulatedMemoryResource, ALLOCATION_ALIGNMENT,
};
use crate::suballocator::{
    ArenaMemoryResource, BinningMemoryResource, ExpandableMemoryResource, FixedSizeMemoryResource,
    PoolMemoryResource, DEFAULT_BLOCKS_TO_PREALLOCATE, DEFAULT_BLOCK_SIZE,
};
use std::sync::Arc;

/// Default bins of `binning`: 2^18..2^22 bytes (benchmarks.md W1).
pub const DEFAULT_BINS: (u32, u32) = (18, 22);

/// How a replay's resources are set up; `None` means the resource's default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceOptions {
    /// The pool's initial size (`pool`, and the pool under `binning`).
    pub initial_pool_size: Option<usize>,
    /// The pool's maximum size.
    pub maximum_pool_size: Option<usize>,
    /// `binning`'s bins: 2^min..2^max bytes (default [`DEFAULT_BINS`]).
    pub bins: Option<(u32, u32)>,
    /// `fixed_size`'s block size (default 1 MiB).
    pub block_size: Option<usize>,
    /// `fixed_size`'s blocks per chunk (default 128).
    pub blocks: Option<usize>,
    /// `arena`'s global arena (default: half the device's free memory).
    pub arena_size: Option<usize>,
}

/// How a resource rounds a request into the block it holds for it (for internal waste).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlockRounding {
    /// Up to a multiple of this alignment (the pool: 256).
    Align(usize),
    /// The driver's rule: whole 2 MiB pages for requests of a page or more, 256 B below (the
    /// simulated device; an estimate for CUDA's own allocators).
    Pages,
    /// Up to the smallest bin that fits (sorted sizes), else to 256 (the pool behind the bins).
    Bins(Vec<usize>),
    /// Every request takes one block of this size.
    Fixed(usize),
}

impl BlockRounding {
    /// Bytes of the block that holds a request of `bytes` (saturating).
    pub fn block(&self, bytes: usize) -> usize {
        if bytes == 0 {
            return 0;
        }
        let align = |a: usize| crate::resource::align_up(bytes, a).unwrap_or(usize::MAX);
        match self {
            BlockRounding::Align(a) => align(*a),
            BlockRounding::Pages => SimulatedMemoryResource::charged_bytes(bytes),
            BlockRounding::Bins(sizes) => match sizes.get(sizes.partition_point(|&s| s < bytes)) {
                Some(&bin) => bin,
                None => align(ALLOCATION_ALIGNMENT),
            },
            BlockRounding::Fixed(size) => *size,
        }
    }
}

/// A resource built for a replay, with what a report says about it.
#[derive(Clone)]
pub struct BuiltResource {
    /// The name the user asked for (canonical).
    pub name: String,
    /// The resource.
    pub resource: SharedResource,
    /// Its setup in words, such as "pool: initial 16.00 GiB (half the free memory), ...".
    pub setup: String,
    /// How it rounds requests into blocks.
    pub rounding: BlockRounding,
    /// The largest request it can serve by design, where it has one (fixed_size).
    pub largest_request: Option<usize>,
    /// The pool sizes it runs with (initial, maximum), where it has a pool.
    pub pool_sizes: Option<(usize, Option<usize>)>,
    /// The arena size it runs with, where it is an arena.
    pub arena_size: Option<usize>,
    /// Whether it is the simulated device itself (one row stands for every base resource).
    pub simulated_device: bool,
}

impl std::fmt::Debug for BuiltResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuiltResource")
            .field("name", &self.name)
            .field("setup", &self.setup)
            .finish_non_exhaustive()
    }
}

/// One resource `rrmm replay` knows.
pub struct ResourceEntry {
    /// Its name on the command line.
    pub name: &'static str,
    /// One line for `--help`.
    pub summary: &'static str,
    /// Builds it over the device: `Some(size)` for a simulated device of `size` bytes.
    build: fn(Option<usize>, &ResourceOptions) -> Result<BuiltResource>,
}

/// The resources, in the order `--compare all` uses.
pub const RESOURCES: &[ResourceEntry] = &[
    ResourceEntry {
        name: "pool",
        summary: "coalescing pool over the device (--initial-pool-size, --maximum-pool-size)",
        build: build_pool,
    },
    ResourceEntry {
        name: "expandable",
        summary: "expandable pool: one virtual range mapped in 2 MiB pages, coalescing across \
                  growth (--initial-pool-size, --maximum-pool-size)",
        build: build_expandable,
    },
    ResourceEntry {
        name: "binning",
        summary: "fixed-size bins (--bins, --blocks) over a pool; larger requests to the pool",
        build: build_binning,
    },
    ResourceEntry {
        name: "arena",
        summary:
            "global arena (--arena-size) with per-thread and per-stream arenas, over the device",
        build: build_arena,
    },
    ResourceEntry {
        name: "fixed_size",
        summary: "blocks of one size (--block-size, --blocks) over the device",
        build: build_fixed_size,
    },
    ResourceEntry {
        name: "cuda_async",
        summary: "cuMemAllocAsync on an owned driver pool (GPU only)",
        build: build_cuda_async,
    },
    ResourceEntry {
        name: "cuda",
        summary: "cuMemAlloc (GPU only)",
        build: build_cuda,
    },
    ResourceEntry {
        name: "managed",
        summary: "cuMemAllocManaged (GPU only)",
        build: build_managed,
    },
    ResourceEntry {
        name: "simulated",
        summary: "the simulated device itself (--simulate): 2 MiB pages, never fragments",
        build: build_simulated_device,
    },
];

/// The resource names [`build`] knows, in the order `--compare all` uses.
pub fn resource_names() -> Vec<&'static str> {
    RESOURCES.iter().map(|e| e.name).collect()
}

/// The canonical form of a resource name (`CUDA-Async` -> `cuda_async`).
pub fn canonical_name(name: &str) -> String {
    name.trim().to_ascii_lowercase().replace('-', "_")
}

/// Builds the resource `name` for a replay: over simulated memory of `simulate` bytes when
/// given, else over real CUDA memory of the current device. On simulated memory, `cuda`,
/// `cuda_async` and `managed` are the simulated device (flagged
/// [`BuiltResource::simulated_device`]). Options a resource does not use are ignored, so one
/// command line can compare every resource.
///
/// # Errors
/// [`Error::InvalidArgument`] for an unknown name or a bad option; CUDA errors (no driver) on
/// real memory; the resource's own validation (RMM's pool size messages).
pub fn build(
    name: &str,
    simulate: Option<usize>,
    options: &ResourceOptions,
) -> Result<BuiltResource> {
    let canonical = canonical_name(name);
    let entry = RESOURCES
        .iter()
        .find(|e| e.name == canonical)
        .ok_or_else(|| {
            Error::invalid(
                "resource",
                format!(
                    "unknown resource {name:?}; known: {}",
                    resource_names().join(", ")
                ),
            )
        })?;
    let mut built = (entry.build)(simulate, options)?;
    built.name = canonical;
    Ok(built)
}

/// [`build`] with only pool sizes, returning the resource alone.
///
/// # Errors
/// As [`build`].
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
/// As [`build`].
pub fn build_resource_sized(
    name: &str,
    simulate: Option<usize>,
    initial_pool_size: Option<usize>,
    maximum_pool_size: Option<usize>,
    arena_size: Option<usize>,
) -> Result<SharedResource> {
    let options = ResourceOptions {
        initial_pool_size,
        maximum_pool_size,
        arena_size,
        ..ResourceOptions::default()
    };
    Ok(build(name, simulate, &options)?.resource)
}

/// Bytes in binary units for setup lines.
pub(crate) fn human(bytes: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    for unit in UNITS {
        if value < 1024.0 || unit == "TiB" {
            return if unit == "B" {
                format!("{bytes} B")
            } else {
                format!("{value:.2} {unit}")
            };
        }
        value /= 1024.0;
    }
    format!("{bytes} B")
}

/// The largest pool size in words: `human(size)`, or "the device" where there is none.
fn maximum_in_words(maximum_pool_size: Option<usize>) -> String {
    maximum_pool_size.map_or_else(|| "the device".into(), human)
}

fn base(resource: SharedResource, setup: String, simulated: bool) -> BuiltResource {
    BuiltResource {
        name: String::new(),
        resource,
        setup,
        rounding: BlockRounding::Pages,
        largest_request: None,
        pool_sizes: None,
        arena_size: None,
        simulated_device: simulated,
    }
}

/// A suballocator as built: 256-byte blocks, and no pool, arena or request limit unless the
/// caller sets one.
fn suballocator(resource: SharedResource, setup: String) -> BuiltResource {
    BuiltResource {
        rounding: BlockRounding::Align(ALLOCATION_ALIGNMENT),
        ..base(resource, setup, false)
    }
}

fn simulated_device(size: usize) -> BuiltResource {
    base(
        Arc::new(SimulatedMemoryResource::new(size)),
        format!(
            "{}, charged in 2 MiB pages (256 B units below a page), never fragments; stands \
             for cuda, cuda_async and managed",
            human(size)
        ),
        true,
    )
}

/// The device under a suballocator: simulated or `cuMemAlloc`.
fn device(simulate: Option<usize>) -> Result<(SharedResource, String)> {
    match simulate {
        Some(size) => Ok((
            Arc::new(SimulatedMemoryResource::new(size)),
            format!("the simulated device ({})", human(size)),
        )),
        None => Ok((Arc::new(CudaMemoryResource::new()?), "cuMemAlloc".into())),
    }
}

fn build_simulated_device(simulate: Option<usize>, _: &ResourceOptions) -> Result<BuiltResource> {
    match simulate {
        Some(size) => Ok(simulated_device(size)),
        None => Err(Error::invalid(
            "resource",
            "simulated needs a size (--simulate SIZE)",
        )),
    }
}

fn build_cuda(simulate: Option<usize>, _: &ResourceOptions) -> Result<BuiltResource> {
    match simulate {
        Some(size) => Ok(simulated_device(size)),
        None => Ok(base(
            Arc::new(CudaMemoryResource::new()?),
            "cuMemAlloc/cuMemFree on the current device (block sizes estimated as the \
             driver's 2 MiB pages)"
                .into(),
            false,
        )),
    }
}

fn build_cuda_async(simulate: Option<usize>, _: &ResourceOptions) -> Result<BuiltResource> {
    match simulate {
        Some(size) => Ok(simulated_device(size)),
        None => Ok(base(
            Arc::new(CudaAsyncMemoryResource::new(
                None,
                None,
                crate::cuda::PoolExport {
                    ipc: false,
                    fabric: false,
                },
            )?),
            "cuMemAllocAsync on an owned driver pool, kept warm across the repeats".into(),
            false,
        )),
    }
}

fn build_managed(simulate: Option<usize>, _: &ResourceOptions) -> Result<BuiltResource> {
    match simulate {
        Some(size) => Ok(simulated_device(size)),
        None => Ok(base(
            Arc::new(ManagedMemoryResource::new()?),
            "cuMemAllocManaged on the current device".into(),
            false,
        )),
    }
}

/// A pool over `upstream` and its setup line.
fn pool_over(
    upstream: SharedResource,
    options: &ResourceOptions,
) -> Result<(PoolMemoryResource, String)> {
    let pool = PoolMemoryResource::new(
        upstream,
        options.initial_pool_size,
        options.maximum_pool_size,
    )?;
    let initial = match options.initial_pool_size {
        Some(size) => human(size),
        None => format!("{} (half the free memory)", human(pool.pool_size())),
    };
    let maximum = maximum_in_words(options.maximum_pool_size);
    Ok((pool, format!("initial {initial}, maximum {maximum}")))
}

fn build_pool(simulate: Option<usize>, options: &ResourceOptions) -> Result<BuiltResource> {
    let (upstream, below) = device(simulate)?;
    let (pool, sizes) = pool_over(upstream, options)?;
    let pool_sizes = Some((pool.pool_size(), options.maximum_pool_size));
    let setup = format!("coalescing pool, {sizes}, over {below}");
    Ok(BuiltResource {
        pool_sizes,
        ..suballocator(Arc::new(pool), setup)
    })
}

fn build_expandable(simulate: Option<usize>, options: &ResourceOptions) -> Result<BuiltResource> {
    let (mr, below) = match simulate {
        Some(size) => (
            ExpandableMemoryResource::new(
                Arc::new(crate::resource::SimulatedVirtualMemory::new(
                    size,
                    size.saturating_mul(crate::suballocator::DEFAULT_RESERVE_FACTOR),
                    crate::resource::DEFAULT_PAGE_SIZE,
                )?),
                options.initial_pool_size,
                options.maximum_pool_size,
                None,
            )?,
            format!("the simulated device ({}, virtual memory)", human(size)),
        ),
        None => (
            ExpandableMemoryResource::on_device(
                crate::cuda::current_device()?,
                None,
                None,
                options.initial_pool_size,
                options.maximum_pool_size,
                None,
            )?,
            "cuMemCreate/cuMemMap".into(),
        ),
    };
    let maximum = maximum_in_words(options.maximum_pool_size);
    let pool_sizes = Some((mr.mapped_bytes(), options.maximum_pool_size));
    let setup = format!("expandable pool, 2 MiB pages, maximum {maximum}, over {below}");
    Ok(BuiltResource {
        pool_sizes,
        ..suballocator(Arc::new(mr), setup)
    })
}

fn build_binning(simulate: Option<usize>, options: &ResourceOptions) -> Result<BuiltResource> {
    let (min, max) = options.bins.unwrap_or(DEFAULT_BINS);
    if min > max || max >= usize::BITS {
        return Err(Error::invalid(
            "bins",
            format!(
                "need MIN <= MAX < {} (powers of two), got {min}:{max}",
                usize::BITS
            ),
        ));
    }
    let blocks = options.blocks.unwrap_or(DEFAULT_BLOCKS_TO_PREALLOCATE);
    if blocks == 0 {
        return Err(Error::invalid("blocks", "must be positive"));
    }
    let (upstream, below) = device(simulate)?;
    let (pool, sizes) = pool_over(upstream, options)?;
    let pool_sizes = Some((pool.pool_size(), options.maximum_pool_size));
    let pool: SharedResource = Arc::new(pool);
    let binning = BinningMemoryResource::new(pool.clone(), None, None)?;
    let mut bin_sizes = Vec::new();
    for e in min..=max {
        let size = 1usize << e;
        let bin =
            FixedSizeMemoryResource::new(pool.clone(), size.max(ALLOCATION_ALIGNMENT), blocks)?;
        binning.add_bin(size, Some(Arc::new(bin)))?;
        bin_sizes.push(size.max(ALLOCATION_ALIGNMENT));
    }
    let setup = format!(
        "bins 2^{min}..2^{max} ({}..{}) x {blocks} blocks per chunk over a pool ({sizes}, over \
         {below}); larger requests to the pool",
        human(1 << min),
        human(1 << max)
    );
    // Its footprint is the pool's, with the bins' free blocks counted free (BinningMemoryResource's
    // report).
    let resource: SharedResource = Arc::new(binning);
    Ok(BuiltResource {
        rounding: BlockRounding::Bins(bin_sizes),
        pool_sizes,
        ..suballocator(resource, setup)
    })
}

fn build_arena(simulate: Option<usize>, options: &ResourceOptions) -> Result<BuiltResource> {
    let (upstream, below) = device(simulate)?;
    let arena = ArenaMemoryResource::new(upstream, options.arena_size, false)?;
    let size = match options.arena_size {
        Some(_) => human(arena.arena_size()),
        None => format!("{} (half the free memory)", human(arena.arena_size())),
    };
    let arena_size = Some(arena.arena_size());
    let setup = format!(
        "global arena of {size}, per-thread arenas for per-thread default streams and \
         per-stream arenas otherwise, over {below}"
    );
    Ok(BuiltResource {
        arena_size,
        ..suballocator(Arc::new(arena), setup)
    })
}

fn build_fixed_size(simulate: Option<usize>, options: &ResourceOptions) -> Result<BuiltResource> {
    let block_size = options.block_size.unwrap_or(DEFAULT_BLOCK_SIZE);
    let blocks = options.blocks.unwrap_or(DEFAULT_BLOCKS_TO_PREALLOCATE);
    if block_size == 0 || blocks == 0 {
        return Err(Error::invalid(
            "block_size",
            "the block size and the block count must be positive",
        ));
    }
    let (upstream, below) = device(simulate)?;
    let fixed = FixedSizeMemoryResource::new(upstream, block_size, blocks)?;
    let block = fixed.block_size();
    let setup = format!(
        "{} blocks, {blocks} per chunk, over {below}; cannot serve requests above {}",
        human(block),
        human(block)
    );
    Ok(BuiltResource {
        rounding: BlockRounding::Fixed(block),
        largest_request: Some(block),
        ..suballocator(Arc::new(fixed), setup)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_simulated_resources_and_rejects_bad_names() {
        for name in ["cuda", "cuda_async", "managed", "simulated", "CUDA-Async"] {
            let built = build(name, Some(1 << 20), &ResourceOptions::default()).unwrap();
            assert_eq!(built.resource.name(), "simulated");
            assert!(built.simulated_device);
            assert!(built.setup.contains("charged in 2 MiB pages"));
        }
        let err = build("nope", Some(1), &ResourceOptions::default()).unwrap_err();
        assert!(err.to_string().contains("unknown resource \"nope\""));
        // Resources without a pool ignore the pool sizes, so one command line compares all.
        assert!(build_resource("cuda", Some(1 << 20), Some(1), None).is_ok());
        assert!(build_resource("simulated", None, None, None).is_err());
        assert_eq!(resource_names()[..3], ["pool", "expandable", "binning"]);
        assert!(resource_names().contains(&"fixed_size"));
    }

    #[test]
    fn builds_suballocators_over_simulated_memory_with_their_setup() {
        let options = ResourceOptions {
            initial_pool_size: Some(1 << 20),
            maximum_pool_size: Some(1 << 29),
            ..ResourceOptions::default()
        };
        let pool = build("pool", Some(1 << 30), &options).unwrap();
        assert_eq!(pool.resource.name(), "pool");
        assert_eq!(
            pool.resource.report().unwrap().footprint().held_bytes,
            1 << 20
        );
        assert_eq!(pool.pool_sizes, Some((1 << 20, Some(1 << 29))));
        assert!(pool.setup.contains("initial 1.00 MiB, maximum 512.00 MiB"));
        let default_pool = build("pool", Some(1 << 30), &ResourceOptions::default()).unwrap();
        assert!(default_pool
            .setup
            .contains("512.00 MiB (half the free memory)"));
        // Five bins of 128 blocks preallocate 992 MiB: more than a 512 MiB pool may hold.
        let err = build("binning", Some(1 << 30), &options).unwrap_err();
        assert!(err.is_out_of_memory(), "{err}");
        let binning = build("binning", Some(1 << 30), &ResourceOptions::default()).unwrap();
        assert_eq!(binning.resource.name(), "binning");
        assert!(binning
            .setup
            .starts_with("bins 2^18..2^22 (256.00 KiB..4.00 MiB) x 128"));
        let arena = build("arena", Some(1 << 30), &options).unwrap();
        assert_eq!(arena.resource.name(), "arena");
        assert_eq!(
            arena.resource.report().unwrap().footprint().held_bytes,
            1 << 29,
            "pool sizes ignored"
        );
        assert!(arena
            .setup
            .starts_with("global arena of 512.00 MiB (half the free memory)"));
        let sized = build_resource_sized("arena", Some(1 << 30), None, None, Some(1 << 24));
        assert_eq!(
            sized.unwrap().report().unwrap().footprint().held_bytes,
            1 << 24
        );
        assert!(build_resource_sized("arena", Some(1 << 30), None, None, Some(4096)).is_err());
        let fixed = build("fixed_size", Some(1 << 30), &ResourceOptions::default()).unwrap();
        assert_eq!(fixed.resource.name(), "fixed_size");
        assert_eq!(fixed.largest_request, Some(1 << 20));
        assert!(fixed.setup.contains("cannot serve requests above 1.00 MiB"));
        // RMM's validation of pool sizes comes through.
        assert!(build_resource("pool", Some(1 << 30), Some(1000), None).is_err());
        assert!(build_resource("binning", Some(1 << 30), Some(1000), None).is_err());
        assert!(build_resource("fixed_size", Some(1 << 30), Some(1000), None).is_ok());
    }

    #[test]
    fn options_shape_the_resources_and_bad_ones_are_named() {
        let options = ResourceOptions {
            bins: Some((10, 12)),
            block_size: Some(4096),
            blocks: Some(4),
            ..ResourceOptions::default()
        };
        let binning = build("binning", Some(1 << 30), &options).unwrap();
        assert_eq!(
            binning.rounding,
            BlockRounding::Bins(vec![1024, 2048, 4096])
        );
        assert!(binning
            .setup
            .starts_with("bins 2^10..2^12 (1.00 KiB..4.00 KiB) x 4 blocks"));
        let fixed = build("fixed_size", Some(1 << 30), &options).unwrap();
        assert_eq!(fixed.rounding, BlockRounding::Fixed(4096));
        // 4 blocks of 4 KiB preallocated.
        assert_eq!(
            fixed.resource.report().unwrap().footprint().held_bytes,
            16384
        );
        let bad = ResourceOptions {
            bins: Some((22, 18)),
            ..ResourceOptions::default()
        };
        assert!(build("binning", Some(1 << 30), &bad)
            .unwrap_err()
            .to_string()
            .contains("bins"));
        let zero = ResourceOptions {
            block_size: Some(0),
            ..ResourceOptions::default()
        };
        assert!(build("fixed_size", Some(1 << 30), &zero).is_err());
    }

    #[test]
    fn block_rounding_of_each_resource() {
        assert_eq!(BlockRounding::Align(256).block(1000), 1024);
        assert_eq!(BlockRounding::Pages.block(1000), 1024);
        assert_eq!(BlockRounding::Pages.block(3 << 20), 4 << 20);
        let bins = BlockRounding::Bins(vec![1 << 18, 1 << 19]);
        assert_eq!(bins.block(1000), 1 << 18);
        assert_eq!(bins.block((1 << 18) + 1), 1 << 19);
        assert_eq!(bins.block((1 << 19) + 1), (1 << 19) + 256);
        assert_eq!(BlockRounding::Fixed(1 << 20).block(10), 1 << 20);
        assert_eq!(BlockRounding::Fixed(1 << 20).block(0), 0);
    }
}
