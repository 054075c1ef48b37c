//! The kinds of stack, by name: the one table `rrmm replay`, `reinitialize` and the Dask plugin
//! read. Each kind turns a target and options into layers, and describes what was built.

use super::layer::{ExpandableOn, Handle, Layer};
use super::{human, BlockRounding, Plan, StackOptions, Target, DEFAULT_BINS};
use crate::error::{Error, Result};
use crate::resource::PlacementMode;
use crate::resource::ALLOCATION_ALIGNMENT;
use crate::suballocator::{
    ExpandableOptions, ExpandableSizes, ManagedOptions, DEFAULT_BLOCKS_TO_PREALLOCATE,
    DEFAULT_BLOCK_SIZE,
};

/// What a built stack's report says: its setup in words, its pool sizes (initial, maximum) and
/// its arena size, where it has them.
pub type Description = (String, Option<(usize, Option<usize>)>, Option<usize>);

/// One kind of stack.
pub struct Kind {
    /// Its name (`reinitialize(pool_allocator="...")`, `rrmm replay --resource ...`).
    pub name: &'static str,
    /// One line for `--help`.
    pub summary: &'static str,
    /// Its plan on a target with options.
    pub plan: fn(Target, &StackOptions) -> Result<Plan>,
    /// Its setup in words, from the handles of the built layers.
    pub describe: fn(Target, &StackOptions, &[Handle]) -> Description,
}

/// Every kind, in the order `--compare all` uses.
pub const KINDS: &[Kind] = &[
    Kind {
        name: "pool",
        summary: "coalescing pool over the device (--initial-pool-size, --maximum-pool-size)",
        plan: plan_pool,
        describe: describe_pool,
    },
    Kind {
        name: "expandable",
        summary: "expandable pool: one virtual range mapped in pages (32 MiB on a GPU, 2 MiB on \
                  simulated memory), coalescing across \
                  growth (--initial-pool-size, --maximum-pool-size)",
        plan: plan_expandable,
        describe: describe_expandable,
    },
    Kind {
        name: "binning",
        summary: "fixed-size bins (--bins, --blocks) over a pool; larger requests to the pool",
        plan: plan_binning,
        describe: describe_binning,
    },
    Kind {
        name: "arena",
        summary:
            "global arena (--arena-size) with per-thread and per-stream arenas, over the device",
        plan: plan_arena,
        describe: describe_arena,
    },
    Kind {
        name: "fixed_size",
        summary: "blocks of one size (--block-size, --blocks) over the device",
        plan: plan_fixed_size,
        describe: describe_fixed_size,
    },
    Kind {
        name: "cuda_async",
        summary: "cuMemAllocAsync on an owned driver pool (GPU only)",
        plan: plan_cuda_async,
        describe: describe_cuda_async,
    },
    Kind {
        name: "cuda",
        summary: "cuMemAlloc (GPU only)",
        plan: plan_cuda,
        describe: describe_cuda,
    },
    Kind {
        name: "managed",
        summary: "cuMemAllocManaged (GPU only)",
        plan: plan_managed,
        describe: describe_managed,
    },
    Kind {
        name: "managed_pool",
        summary: "coalescing pool over managed memory (--initial-pool-size, --maximum-pool-size)",
        plan: plan_managed_pool,
        describe: describe_managed_pool,
    },
    Kind {
        name: "fallback",
        summary: "coalescing pool over the device that falls back to managed memory when the \
                  device is full (--initial-pool-size, --maximum-pool-size)",
        plan: plan_fallback,
        describe: describe_fallback,
    },
    Kind {
        name: "any_size",
        summary: "data of any size, no size to give: the expandable pool over the device (128 MiB \
                  pages), then \
                  pinned host pages under its own addresses once the device is full (made in \
                  the background from three quarters full; up to the host's room or \
                  --spill-to-host), moved back to the device at safe points",
        plan: plan_any_size,
        describe: describe_any_size,
    },
    Kind {
        name: "tiered",
        summary: "data beyond one GPU: a coalescing pool over the device, then a peer GPU \
                  (--peer-memory on a simulated device), then pinned host memory \
                  (--host-memory), with counts per tier",
        plan: plan_tiered,
        describe: describe_tiered,
    },
    Kind {
        name: "pinned",
        summary: "pinned host memory (cuMemHostAlloc; large allocations registered on the GPU's \
                  NUMA node)",
        plan: plan_pinned,
        describe: describe_pinned,
    },
    Kind {
        name: "pinned_pool",
        summary: "coalescing pool over pinned host memory (--initial-pool-size, \
                  --maximum-pool-size)",
        plan: plan_pinned_pool,
        describe: describe_pinned_pool,
    },
    Kind {
        name: "pinned_expandable",
        summary: "expandable pool over pinned host memory: one host range registered in 32 MiB \
                  pages, coalescing across growth (--initial-pool-size, --maximum-pool-size)",
        plan: plan_pinned_expandable,
        describe: describe_pinned_expandable,
    },
    Kind {
        name: "simulated",
        summary: "the simulated device itself (--simulate): 2 MiB pages, never fragments",
        plan: plan_simulated,
        describe: describe_cuda,
    },
];

/// The device's source resource: `on_device` on the device, the simulated device on a
/// simulated target.
fn device(target: Target, on_device: Layer) -> Layer {
    match target {
        Target::Device => on_device,
        Target::Simulated(size) => Layer::Simulated {
            size,
            host_memory: 0,
        },
    }
}

/// A plan whose top resource hands out 256-byte blocks.
fn suballocator(name: &'static str, layers: Vec<Layer>) -> Plan {
    Plan {
        name,
        layers,
        rounding: BlockRounding::Align(ALLOCATION_ALIGNMENT),
        largest_request: None,
        simulated_device: false,
    }
}

/// A plan of a source resource alone (the simulated device stands for every source resource).
fn source_plan(name: &'static str, target: Target, on_device: Layer) -> Plan {
    Plan {
        name,
        layers: vec![device(target, on_device)],
        rounding: BlockRounding::Pages,
        largest_request: None,
        simulated_device: matches!(target, Target::Simulated(_)),
    }
}

fn pool_layer(options: &StackOptions) -> Layer {
    Layer::Pool {
        initial_pool_size: options.initial_pool_size,
        maximum_pool_size: options.maximum_pool_size,
    }
}

fn plan_pool(target: Target, options: &StackOptions) -> Result<Plan> {
    Ok(suballocator(
        "pool",
        vec![device(target, Layer::Cuda), pool_layer(options)],
    ))
}

/// Managed memory with RMM's defaults and rrmm's cache, placed as `placement` says (its own
/// ranges when used directly, the blocks of the suballocator over it in a managed pool).
fn managed(cache_limit: Option<usize>, placement: PlacementMode) -> Layer {
    Layer::Managed(ManagedOptions {
        cache_limit,
        placement,
    })
}

/// Managed memory: `cuMemAllocManaged` on the device; on a simulated device, the device with a
/// host tier (allocations beyond it succeed and are counted).
fn managed_device(target: Target, options: &StackOptions) -> Layer {
    match target {
        Target::Device => managed(None, PlacementMode::Ranges),
        Target::Simulated(size) => Layer::Simulated {
            size,
            host_memory: options.host_memory.unwrap_or(
                crate::resource::MAX_SIMULATED_SIZE - size.min(crate::resource::MAX_SIMULATED_SIZE),
            ),
        },
    }
}

/// How many times the device's memory a managed pool over a simulated device may grow to by
/// default, when no host memory is given (the user documents' "up to twice the VRAM").
pub const MANAGED_POOL_DEVICE_MULTIPLE: usize = 2;

/// The share of the host's available memory a managed pool may grow into by default (the rest
/// stays for the process and the system): 15/16.
const MANAGED_POOL_HOST_SHARE: (usize, usize) = (15, 16);

/// A managed pool's default maximum: the device plus what the host can hold (15/16 of its
/// available memory when the pool is made, capped by the cgroup's room; twice the device where
/// that is not known); on a simulated device, the device plus its host memory (twice the device
/// when none is given).
fn managed_pool_maximum(target: Target, options: &StackOptions) -> Result<usize> {
    let total = device_total(target)?;
    let beyond = match target {
        Target::Simulated(size) => options.host_memory.unwrap_or(size),
        // The figure the pinned pools are checked against: MemAvailable capped by the cgroup's
        // room (a container's limit, which MemAvailable alone does not show).
        Target::Device => crate::os::host_pages::available_host_memory().map_or(
            total.saturating_mul(MANAGED_POOL_DEVICE_MULTIPLE - 1),
            |room| room.available / MANAGED_POOL_HOST_SHARE.1 * MANAGED_POOL_HOST_SHARE.0,
        ),
    };
    Ok(total
        .saturating_add(beyond)
        .min(crate::resource::MAX_SIMULATED_SIZE)
        & !(ALLOCATION_ALIGNMENT - 1))
}

/// The device's total memory: the simulated size, or the current device's.
fn device_total(target: Target) -> Result<usize> {
    match target {
        Target::Simulated(size) => Ok(size),
        Target::Device => {
            let ordinal = crate::cuda::current_device()?;
            Ok(crate::cuda::device_memory_info(ordinal)?.1)
        }
    }
}

/// The pool over the device, falling back to managed memory (on a simulated device: host
/// memory beyond it, counted as bytes beyond the device).
fn plan_fallback(target: Target, options: &StackOptions) -> Result<Plan> {
    let alternate = match target {
        Target::Device => managed(None, PlacementMode::Ranges),
        Target::Simulated(_) => Layer::Simulated {
            size: 0,
            host_memory: options
                .host_memory
                .unwrap_or(crate::resource::MAX_SIMULATED_SIZE),
        },
    };
    Ok(suballocator(
        "fallback",
        vec![
            device(target, Layer::Cuda),
            pool_layer(options),
            Layer::Fallback {
                alternate: Box::new(alternate),
            },
        ],
    ))
}

fn describe_fallback(target: Target, options: &StackOptions, handles: &[Handle]) -> Description {
    let (pool, sizes, _) = pool_over(target, options, handles);
    let alternate = match target {
        Target::Device => "managed memory".to_string(),
        Target::Simulated(_) => match options.host_memory {
            Some(h) => format!("{} of host memory", human(h)),
            None => "unlimited host memory".into(),
        },
    };
    (
        format!("{pool}, falling back to {alternate} when the device is full"),
        sizes,
        None,
    )
}

/// The pool over the device, then a peer GPU, then pinned host memory (on a simulated device:
/// a second simulated device of `peer_memory` bytes, the device's size by default, and
/// simulated host memory of `host_memory` bytes, unlimited by default).
fn plan_tiered(target: Target, options: &StackOptions) -> Result<Plan> {
    let max = crate::resource::MAX_SIMULATED_SIZE;
    let (peer, host) = match target {
        Target::Device => (
            Layer::Peer {
                peer: options.peer_device,
            },
            Layer::PinnedHost,
        ),
        Target::Simulated(size) => (
            Layer::Simulated {
                size: options.peer_memory.unwrap_or(size),
                host_memory: 0,
            },
            Layer::Simulated {
                size: 0,
                host_memory: options.host_memory.unwrap_or(max),
            },
        ),
    };
    Ok(suballocator(
        "tiered",
        vec![
            device(target, Layer::Cuda),
            pool_layer(options),
            Layer::Tiered {
                tiers: vec![("peer".into(), peer), ("host".into(), host)],
            },
        ],
    ))
}

fn describe_tiered(target: Target, options: &StackOptions, handles: &[Handle]) -> Description {
    let (pool, sizes, _) = pool_over(target, options, handles);
    let tiers = handles.iter().find_map(|h| match h {
        Handle::Tiered(_, tiers) => Some(tiers),
        _ => None,
    });
    let words = match (target, tiers.map(|t| t.as_slice())) {
        (Target::Simulated(_), Some([Handle::Simulated(peer), Handle::Simulated(host)])) => {
            let host = match options.host_memory {
                Some(_) => format!("{} of host memory", human(host.host_tier())),
                None => "unlimited host memory".into(),
            };
            format!(
                "a simulated peer GPU of {}, then {host}",
                human(peer.size())
            )
        }
        (Target::Device, Some([Handle::Peer(_, peer), ..])) => {
            format!("peer GPU {peer} (cuMemAlloc, peer access), then pinned host memory")
        }
        _ => "a peer GPU, then host memory".into(),
    };
    (
        format!("{pool}; when the device is full, {words}"),
        sizes,
        None,
    )
}

fn plan_managed_pool(target: Target, options: &StackOptions) -> Result<Plan> {
    let maximum = match options.maximum_pool_size {
        Some(m) => m,
        None => managed_pool_maximum(target, options)?,
    };
    let pool = Layer::Pool {
        initial_pool_size: options.initial_pool_size,
        maximum_pool_size: Some(maximum),
    };
    // The pool keeps what it frees; the managed resource under it keeps nothing more (a chunk
    // the pool releases goes back to the driver); the pool places the blocks it hands out, the
    // managed resource none of its chunks.
    let below = match target {
        Target::Device => managed(Some(0), PlacementMode::Blocks),
        Target::Simulated(_) => managed_device(target, options),
    };
    Ok(suballocator("managed_pool", vec![below, pool]))
}

/// An expandable pool with the options' sizes, pages of `page_size` on `on` (a simulated
/// target maps simulated virtual memory).
fn expandable(
    target: Target,
    options: &StackOptions,
    page_size: Option<usize>,
    on: ExpandableOn,
) -> Layer {
    Layer::Expandable {
        on: match target {
            Target::Simulated(size) => ExpandableOn::Simulated(size),
            Target::Device => on,
        },
        options: ExpandableOptions {
            sizes: ExpandableSizes {
                initial_pool_size: options.initial_pool_size,
                maximum_pool_size: options.maximum_pool_size,
                release_threshold: options.release_threshold,
            },
            reserve_size: None,
            page_size,
            spill_to_host: match (target, on) {
                (Target::Device, ExpandableOn::Device) => options.spill_to_host,
                _ => None,
            },
            shareable: false,
        },
    }
}

fn plan_expandable(target: Target, options: &StackOptions) -> Result<Plan> {
    Ok(suballocator(
        "expandable",
        vec![expandable(target, options, None, ExpandableOn::Device)],
    ))
}

/// The expandable pool that spills to at most `spill_to_host` bytes of host pages, else to as
/// many as the host has room for now (no spill on simulated memory).
fn plan_any_size(target: Target, options: &StackOptions) -> Result<Plan> {
    let mut options = options.clone();
    if options.spill_to_host.is_none() {
        options.spill_to_host =
            Some(crate::os::host_pages::available_host_memory().map_or(0, |r| r.available));
    }
    let page = matches!(target, Target::Device).then_some(ANY_SIZE_DEVICE_PAGE_SIZE);
    Ok(suballocator(
        "any_size",
        vec![expandable(target, &options, page, ExpandableOn::Device)],
    ))
}

/// The any_size pool's page on a device: 128 MiB. Each page is one driver call to make and
/// one to map, whatever its size (a device page of 2 MiB is made and mapped at 32 GB/s, one of
/// 32 MiB at 540, of 128 MiB at 1,800: `benches/gpu/probe_host_page_rate.cu device`, H200);
/// W11 at half the device fills in 0.09 s with 128 MiB pages, as the device pool, against
/// 0.17-0.23 s with the expandable pool's 32 MiB. Data that may not fit is large: a trim or a
/// promotion in 128 MiB steps costs it nothing.
pub const ANY_SIZE_DEVICE_PAGE_SIZE: usize = 128 << 20;

fn describe_any_size(target: Target, options: &StackOptions, handles: &[Handle]) -> Description {
    let over = match target {
        Target::Simulated(size) => {
            format!(
                "the simulated device ({}, virtual memory; no spill)",
                human(size)
            )
        }
        Target::Device => {
            "cuMemCreate/cuMemMap, then pinned host pages once the device is full".into()
        }
    };
    expandable_description("the device", &over, options, handles)
}

fn bins(options: &StackOptions) -> Result<(u32, u32)> {
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
    Ok((min, max))
}

fn blocks(options: &StackOptions) -> Result<usize> {
    match options.blocks {
        Some(0) => Err(Error::invalid(
            "blocks",
            "blocks=0: must be positive (blocks per chunk, at least 1; default 128)",
        )),
        Some(b) => Ok(b),
        None => Ok(DEFAULT_BLOCKS_TO_PREALLOCATE),
    }
}

fn plan_binning(target: Target, options: &StackOptions) -> Result<Plan> {
    let (min, max) = bins(options)?;
    let binning = Layer::Binning {
        bins: Some((min, max)),
        blocks_to_preallocate: blocks(options)?,
    };
    let sizes = (min..=max)
        .map(|e| (1usize << e).max(ALLOCATION_ALIGNMENT))
        .collect();
    Ok(Plan {
        rounding: BlockRounding::Bins(sizes),
        ..suballocator(
            "binning",
            vec![device(target, Layer::Cuda), pool_layer(options), binning],
        )
    })
}

fn plan_arena(target: Target, options: &StackOptions) -> Result<Plan> {
    Ok(suballocator(
        "arena",
        vec![
            device(target, Layer::Cuda),
            Layer::Arena {
                arena_size: options.arena_size,
            },
        ],
    ))
}

fn plan_fixed_size(target: Target, options: &StackOptions) -> Result<Plan> {
    let block_size = options.block_size.unwrap_or(DEFAULT_BLOCK_SIZE);
    let block = crate::suballocator::block_of("block_size", block_size)?;
    blocks(options)?;
    Ok(Plan {
        rounding: BlockRounding::Fixed(block),
        largest_request: Some(block),
        ..suballocator(
            "fixed_size",
            vec![
                device(target, Layer::Cuda),
                Layer::FixedSize {
                    block_size,
                    blocks_to_preallocate: blocks(options)?,
                },
            ],
        )
    })
}

fn plan_cuda_async(target: Target, options: &StackOptions) -> Result<Plan> {
    let on_device = Layer::CudaAsync {
        initial_pool_size: options.initial_pool_size,
        release_threshold: options.release_threshold,
    };
    Ok(source_plan("cuda_async", target, on_device))
}

fn plan_cuda(target: Target, _: &StackOptions) -> Result<Plan> {
    Ok(source_plan("cuda", target, Layer::Cuda))
}

fn plan_managed(target: Target, options: &StackOptions) -> Result<Plan> {
    Ok(Plan {
        layers: vec![managed_device(target, options)],
        // On a simulated device it is its own row: a device with a host tier.
        simulated_device: false,
        ..source_plan("managed", target, managed(None, PlacementMode::Ranges))
    })
}

fn plan_pinned(target: Target, _: &StackOptions) -> Result<Plan> {
    Ok(source_plan("pinned", target, Layer::PinnedHost))
}

fn plan_pinned_pool(target: Target, options: &StackOptions) -> Result<Plan> {
    Ok(suballocator(
        "pinned_pool",
        vec![device(target, Layer::PinnedHost), pool_layer(options)],
    ))
}

fn plan_pinned_expandable(target: Target, options: &StackOptions) -> Result<Plan> {
    let page = Some(crate::resource::HOST_PAGE_SIZE);
    Ok(suballocator(
        "pinned_expandable",
        vec![expandable(target, options, page, ExpandableOn::PinnedHost)],
    ))
}

fn describe_pinned(target: Target, _: &StackOptions, _: &[Handle]) -> Description {
    base_words(
        target,
        "pinned host memory (cuMemHostAlloc; from 1 MiB, pages registered on the GPU's NUMA node)",
    )
}

fn describe_pinned_pool(target: Target, options: &StackOptions, handles: &[Handle]) -> Description {
    let (sizes, pool_sizes) = pool_words(options, handles);
    let over = match target {
        Target::Simulated(size) => format!("simulated host memory ({})", human(size)),
        Target::Device => "pinned host memory".into(),
    };
    (
        format!(
            "coalescing pool, {}, over {over}",
            sizes.replace("the device", "host memory")
        ),
        pool_sizes,
        None,
    )
}

fn describe_pinned_expandable(
    target: Target,
    options: &StackOptions,
    handles: &[Handle],
) -> Description {
    let over = match target {
        Target::Simulated(size) => format!("simulated host memory ({}, virtual)", human(size)),
        Target::Device => "host memory registered with CUDA (cuMemHostRegister)".into(),
    };
    expandable_description("host memory", &over, options, handles)
}

fn plan_simulated(target: Target, _: &StackOptions) -> Result<Plan> {
    match target {
        Target::Simulated(_) => Ok(source_plan("simulated", target, Layer::Cuda)),
        Target::Device => Err(Error::invalid(
            "resource",
            "simulated needs a size (--simulate SIZE)",
        )),
    }
}

// ---------------------------------------------------------------- descriptions

/// The device under a suballocator, in words.
fn below(target: Target) -> String {
    match target {
        Target::Simulated(size) => format!("the simulated device ({})", human(size)),
        Target::Device => "cuMemAlloc".into(),
    }
}

/// The pool's sizes in words and as figures.
fn pool_words(
    options: &StackOptions,
    handles: &[Handle],
) -> (String, Option<(usize, Option<usize>)>) {
    let pool = handles.iter().find_map(|h| match h {
        Handle::Pool(pool, made) => Some((pool.maximum_pool_size(), *made)),
        _ => None,
    });
    let size = pool.map(|(_, made)| made);
    let initial = match (options.initial_pool_size, size) {
        (Some(s), _) => human(s),
        (None, Some(s)) => format!("{} (half the free memory)", human(s)),
        (None, None) => "?".into(),
    };
    let maximum_bytes = pool.map_or(options.maximum_pool_size, |(m, _)| m);
    let maximum = match (options.maximum_pool_size, maximum_bytes) {
        (None, Some(m)) => format!("{} (the device and the host memory it may use)", human(m)),
        (_, m) => m.map_or_else(|| "the device".into(), human),
    };
    (
        format!("initial {initial}, maximum {maximum}"),
        size.map(|s| (s, maximum_bytes)),
    )
}

fn pool_over(target: Target, options: &StackOptions, handles: &[Handle]) -> Description {
    let (sizes, pool_sizes) = pool_words(options, handles);
    (
        format!("coalescing pool, {sizes}, over {}", below(target)),
        pool_sizes,
        None,
    )
}

fn describe_pool(target: Target, options: &StackOptions, handles: &[Handle]) -> Description {
    pool_over(target, options, handles)
}

fn describe_managed_pool(
    target: Target,
    options: &StackOptions,
    handles: &[Handle],
) -> Description {
    let (sizes, pool_sizes) = pool_words(options, handles);
    let over = match (target, handles.first()) {
        (Target::Simulated(size), Some(Handle::Simulated(sim))) => format!(
            "managed memory: the simulated device ({}) with {} beyond it",
            human(size),
            host_tier_words(options, sim)
        ),
        _ => "cuMemAllocManaged".into(),
    };
    (
        format!("coalescing pool, {sizes}, over {over}"),
        pool_sizes,
        None,
    )
}

fn describe_expandable(target: Target, options: &StackOptions, handles: &[Handle]) -> Description {
    let over = match target {
        Target::Simulated(size) => {
            format!("the simulated device ({}, virtual memory)", human(size))
        }
        Target::Device => "cuMemCreate/cuMemMap".into(),
    };
    expandable_description("the device", &over, options, handles)
}

/// An expandable pool's description (device or pinned host): its page size (the built pool's
/// own), its maximum (`unlimited`: what bounds it without one), what it maps over, and its
/// mapped bytes.
fn expandable_description(
    unlimited: &str,
    over: &str,
    options: &StackOptions,
    handles: &[Handle],
) -> Description {
    let pool = handles.iter().find_map(|h| match h {
        Handle::Expandable(e) => Some(e),
        _ => None,
    });
    let mapped = pool.map(|e| e.mapped_bytes());
    let pages = pool.map_or_else(|| "-".into(), |e| human(e.page_size()));
    let maximum = options
        .maximum_pool_size
        .map_or_else(|| unlimited.into(), human);
    (
        format!("expandable pool, {pages} pages, maximum {maximum}, over {over}"),
        mapped.map(|m| (m, options.maximum_pool_size)),
        None,
    )
}

fn describe_binning(target: Target, options: &StackOptions, handles: &[Handle]) -> Description {
    let (min, max) = options.bins.unwrap_or(DEFAULT_BINS);
    let blocks = options.blocks.unwrap_or(DEFAULT_BLOCKS_TO_PREALLOCATE);
    let (sizes, pool_sizes) = pool_words(options, handles);
    (
        format!(
            "bins 2^{min}..2^{max} ({}..{}) x {blocks} blocks per chunk over a pool ({sizes}, \
             over {}); larger requests to the pool",
            human(1 << min),
            human(1 << max),
            below(target)
        ),
        pool_sizes,
        None,
    )
}

fn describe_arena(target: Target, options: &StackOptions, handles: &[Handle]) -> Description {
    let size = handles.iter().find_map(|h| match h {
        Handle::Arena(a) => Some(a.arena_size()),
        _ => None,
    });
    let words = match (options.arena_size, size) {
        (Some(_), Some(s)) => human(s),
        (_, Some(s)) => format!("{} (half the free memory)", human(s)),
        _ => "?".into(),
    };
    (
        format!(
            "global arena of {words}, per-thread arenas for per-thread default streams and \
             per-stream arenas otherwise, over {}",
            below(target)
        ),
        None,
        size,
    )
}

fn describe_fixed_size(target: Target, options: &StackOptions, handles: &[Handle]) -> Description {
    let block = handles
        .iter()
        .find_map(|h| match h {
            Handle::FixedSize(f) => Some(f.block_size()),
            _ => None,
        })
        .unwrap_or(0);
    let blocks = options.blocks.unwrap_or(DEFAULT_BLOCKS_TO_PREALLOCATE);
    (
        format!(
            "{} blocks, {blocks} per chunk, over {}; cannot serve requests above {}",
            human(block),
            below(target),
            human(block)
        ),
        None,
        None,
    )
}

/// A source resource in words: the simulated device that stands for it, or `on_device`.
fn base_words(target: Target, on_device: &str) -> Description {
    let words = match target {
        Target::Simulated(size) => format!(
            "{}, charged in 2 MiB pages (256 B units below a page), never fragments; stands \
             for cuda and cuda_async (managed memory is its own row: the device with a host tier)",
            human(size)
        ),
        Target::Device => on_device.to_string(),
    };
    (words, None, None)
}

fn describe_cuda(target: Target, _: &StackOptions, _: &[Handle]) -> Description {
    base_words(
        target,
        "cuMemAlloc/cuMemFree on the current device (block sizes estimated as the driver's 2 MiB \
         pages)",
    )
}

fn describe_cuda_async(target: Target, _: &StackOptions, _: &[Handle]) -> Description {
    base_words(
        target,
        "cuMemAllocAsync on an owned driver pool, kept warm across the repeats",
    )
}

/// The host memory of a simulated managed device in words.
fn host_tier_words(
    options: &StackOptions,
    sim: &crate::resource::SimulatedMemoryResource,
) -> String {
    match options.host_memory {
        Some(_) => format!("{} of host memory", human(sim.host_tier())),
        None => "unlimited host memory".into(),
    }
}

fn describe_managed(target: Target, options: &StackOptions, handles: &[Handle]) -> Description {
    match (target, handles.first()) {
        (Target::Simulated(size), Some(Handle::Simulated(sim))) => (
            format!(
                "managed memory: the simulated device ({}) with {} beyond it, charged in 2 MiB \
                 pages; bytes beyond the device are what would live in host memory",
                human(size),
                host_tier_words(options, sim)
            ),
            None,
            None,
        ),
        _ => base_words(target, "cuMemAllocManaged on the current device"),
    }
}
