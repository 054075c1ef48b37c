//! One builder of resource stacks from a description: a kind (by name), sizes and options, and
//! where (the current device, or a simulated device of a given size). `rrmm replay`, Python's
//! `reinitialize` and the Dask plugin all build through it, so a kind added here is available
//! in all three.
//!
//! A description becomes a [`Plan`]: its [`Layer`]s (typed resources with their options,
//! bottom to top) and what a report says about the result. [`Layer::build`] makes each layer
//! over the one below: [`build`] builds a whole plan (the replay, Rust programs), and Python's
//! `_rrmm.build_stack` builds the same layers and gives each its `rrmm.mr` class in the same
//! call (`PoolMemoryResource` over `ManagedMemoryResource`, with `upstream_mr`).
//!
//! # Adding a kind
//! One entry in [`KINDS`]: its name, a one-line summary, and a function from the target and the
//! options to the layers and the report's facts. A new resource also needs its [`Layer`] and
//! [`Handle`] variants, and its Python class in the bindings' wrapper.
//!
//! ```
//! use rrmm::stack::{build, StackOptions, Target};
//!
//! let options = StackOptions { initial_pool_size: Some(1 << 20), ..StackOptions::default() };
//! let built = build("pool", Target::Simulated(1 << 30), &options)?;
//! assert_eq!(built.resource.name(), "pool");
//! assert_eq!(built.pool_sizes, Some((1 << 20, None)));
//! # Ok::<(), rrmm::Error>(())
//! ```

mod kinds;
pub mod layer;

pub use kinds::{Kind, KINDS};
pub use layer::{ExpandableOn, Handle, Layer, Sources};

use crate::error::{Error, Result};
use crate::resource::{SharedResource, SimulatedMemoryResource, ALLOCATION_ALIGNMENT};

/// Where a stack is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The current CUDA device.
    Device,
    /// A simulated device of this many bytes (no memory behind it): replays and tests.
    Simulated(usize),
}

impl Target {
    /// `Some(size)` for a simulated device (the replay's `simulate`), `None` for the device.
    pub fn from_simulate(simulate: Option<usize>) -> Self {
        simulate.map_or(Target::Device, Target::Simulated)
    }
}

/// The options of a stack; `None` means the resource's default. Options a kind does not use are
/// ignored, so one description can be built as every kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StackOptions {
    /// A pool's initial size (pool, managed_pool, binning's pool, expandable).
    pub initial_pool_size: Option<usize>,
    /// A pool's maximum size.
    pub maximum_pool_size: Option<usize>,
    /// `binning`'s bins: 2^min..2^max bytes (default [`DEFAULT_BINS`]).
    pub bins: Option<(u32, u32)>,
    /// `fixed_size`'s block size (default 1 MiB).
    pub block_size: Option<usize>,
    /// Blocks per chunk of `fixed_size` and of binning's bins (default 128).
    pub blocks: Option<usize>,
    /// `arena`'s global arena (default: half the device's free memory).
    pub arena_size: Option<usize>,
    /// `cuda_async`'s and `expandable`'s release threshold.
    pub release_threshold: Option<usize>,
    /// A limit on the bytes allocated at once (a `LimitingResourceAdaptor` on top).
    pub allocation_limit: Option<usize>,
    /// Log every allocation (a `LoggingResourceAdaptor` on top) ...
    pub logging: bool,
    /// ... to this file (default: `$RMM_LOG_FILE`, as RMM's adaptor).
    pub log_file: Option<String>,
    /// Count allocations (a `StatisticsResourceAdaptor` on top, above the log).
    pub statistics: bool,
    /// Track every live allocation (a `TrackingResourceAdaptor` on top, above the counts).
    pub tracking: bool,
    /// Managed memory on a simulated device: bytes of host memory beyond the device
    /// (default: as much as the simulated address space allows).
    pub host_memory: Option<usize>,
    /// `tiered` on a simulated device: the bytes of the simulated peer GPU (default: the
    /// device's size, a second GPU of the same kind).
    pub peer_memory: Option<usize>,
    /// `tiered` on the device: the peer GPU's ordinal (default: the first GPU with a peer link
    /// to the current one).
    pub peer_device: Option<usize>,
    /// `expandable` on the device: spill to at most this many bytes of host pages when the
    /// device is full ([`ExpandableOptions::spill_to_host`]; no spill on simulated memory).
    ///
    /// [`ExpandableOptions::spill_to_host`]: crate::suballocator::ExpandableOptions::spill_to_host
    pub spill_to_host: Option<usize>,
}

impl StackOptions {
    /// Each size of simulated memory on `target` (the device, `peer_memory`, `host_memory`) at
    /// most [`MAX_SIMULATED_SIZE`](crate::resource::MAX_SIMULATED_SIZE), each refusal naming
    /// its option (on a device they are not read).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the option and the value.
    pub fn check_simulated(&self, target: Target) -> Result<()> {
        let Target::Simulated(size) = target else {
            return Ok(());
        };
        [
            ("simulate", Some(size)),
            ("peer_memory", self.peer_memory),
            ("host_memory", self.host_memory),
        ]
        .into_iter()
        .filter_map(|(name, bytes)| bytes.map(|b| (name, b)))
        .try_for_each(|(name, bytes)| check_simulated_size(name, bytes))
    }
}

/// A size of simulated memory given as option `name` (a simulated device, a peer GPU, host
/// memory): 0, or from 256 bytes (sizes are counted in 256-byte units: 1 to 255 would be
/// nothing, so it is a slip, and the message suggests the GiB likely meant) to
/// [`MAX_SIMULATED_SIZE`](crate::resource::MAX_SIMULATED_SIZE).
///
/// # Errors
/// [`Error::InvalidArgument`] naming `name`, the value and the fix.
pub fn check_simulated_size(name: &'static str, bytes: usize) -> Result<()> {
    let max = crate::resource::MAX_SIMULATED_SIZE;
    if bytes > max {
        return Err(Error::invalid(
            name,
            format!(
                "{name}={bytes} bytes is more than simulated memory can be: at most {max} bytes \
                 (32 PiB)"
            ),
        ));
    }
    if bytes > 0 && bytes < ALLOCATION_ALIGNMENT {
        let meant = crate::report::likely_meant_device(bytes)
            .map_or_else(String::new, |m| format!("; did you mean \"{m}\"?"));
        return Err(Error::invalid(
            name,
            format!(
                "{name}={bytes} bytes rounds down to 0: simulated memory counts in 256-byte \
                 units (RMM's alignment; requests of 2 MiB or more take whole 2 MiB pages), so \
                 give 0 or at least 256 bytes{meant}"
            ),
        ));
    }
    Ok(())
}

/// Default bins of `binning`: 2^18..2^22 bytes (benchmarks.md W1).
pub const DEFAULT_BINS: (u32, u32) = (18, 22);

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

/// A description made concrete: the layers and what a report says about the stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The kind's name (canonical).
    pub name: &'static str,
    /// The resources, bottom to top.
    pub layers: Vec<Layer>,
    /// How the top resource rounds requests into blocks.
    pub rounding: BlockRounding,
    /// The largest request it can serve by design (fixed_size).
    pub largest_request: Option<usize>,
    /// Whether it is a simulated device itself (one replay row stands for every source resource).
    pub simulated_device: bool,
}

/// A stack as built in Rust, with what a report says about it.
#[derive(Clone)]
pub struct BuiltStack {
    /// The kind's name (canonical).
    pub name: String,
    /// The top resource.
    pub resource: SharedResource,
    /// Its setup in words, such as "coalescing pool, initial 16.00 GiB (half the free memory),
    /// ...".
    pub setup: String,
    /// How it rounds requests into blocks.
    pub rounding: BlockRounding,
    /// The largest request it can serve by design, where it has one (fixed_size).
    pub largest_request: Option<usize>,
    /// The pool sizes it runs with (initial, maximum), where it has a pool.
    pub pool_sizes: Option<(usize, Option<usize>)>,
    /// The arena size it runs with, where it is an arena.
    pub arena_size: Option<usize>,
    /// Whether it is the simulated device itself.
    pub simulated_device: bool,
    /// Each layer's handle, bottom to top.
    pub handles: Vec<Handle>,
}

impl BuiltStack {
    /// The simulated device with a host tier under the stack (managed memory), whose bytes
    /// beyond the device a replay follows.
    pub fn managed_device(
        &self,
    ) -> Option<std::sync::Arc<crate::resource::SimulatedMemoryResource>> {
        self.handles.iter().find_map(|h| match h {
            Handle::Simulated(sim) if sim.host_tier() > 0 => Some(sim.clone()),
            Handle::Fallback(_, alternate) => match alternate.as_ref() {
                Handle::Simulated(sim) if sim.host_tier() > 0 => Some(sim.clone()),
                _ => None,
            },
            _ => None,
        })
    }
}

impl std::fmt::Debug for BuiltStack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuiltStack")
            .field("name", &self.name)
            .field("setup", &self.setup)
            .finish_non_exhaustive()
    }
}

/// The canonical form of a kind's name (`CUDA-Async` -> `cuda_async`).
pub fn canonical_name(name: &str) -> String {
    name.trim().to_ascii_lowercase().replace('-', "_")
}

/// The kind names, in the order `--compare all` uses.
pub fn kind_names() -> Vec<&'static str> {
    KINDS.iter().map(|k| k.name).collect()
}

/// The kind called `name` (any case, `-` for `_`).
///
/// # Errors
/// [`Error::InvalidArgument`] naming the known kinds.
pub fn kind(name: &str) -> Result<&'static Kind> {
    let canonical = canonical_name(name);
    KINDS.iter().find(|k| k.name == canonical).ok_or_else(|| {
        Error::invalid(
            "resource",
            format!(
                "unknown resource {name:?}; known: {}",
                kind_names().join(", ")
            ),
        )
    })
}

/// The plan of kind `name` on `target` with `options`: the layers and the report's facts, with
/// the options checked. The kind's own layers come first, then, in this order, a limit, a log,
/// counts and tracking where the options ask for them.
///
/// # Errors
/// [`Error::InvalidArgument`] for an unknown name or a bad option.
pub fn plan(name: &str, target: Target, options: &StackOptions) -> Result<Plan> {
    let kind = kind(name)?;
    options.check_simulated(target)?;
    let mut plan = (kind.plan)(target, options)?;
    plan.layers.iter().try_for_each(Layer::check)?;
    if let Some(allocation_limit) = options.allocation_limit {
        plan.layers.push(Layer::Limit { allocation_limit });
    }
    if options.logging {
        plan.layers.push(Layer::Logging {
            log_file: options.log_file.clone(),
        });
    }
    if options.statistics {
        plan.layers.push(Layer::Statistics);
    }
    if options.tracking {
        plan.layers.push(Layer::Tracking);
    }
    Ok(plan)
}

/// Builds kind `name` on `target` with `options`, in Rust.
///
/// # Errors
/// As [`plan`]; the resources' own errors (RMM's size messages, out of memory, no driver).
pub fn build(name: &str, target: Target, options: &StackOptions) -> Result<BuiltStack> {
    let plan = plan(name, target, options)?;
    let mut below: Option<SharedResource> = None;
    let mut handles = Vec::with_capacity(plan.layers.len());
    for layer in &plan.layers {
        let handle = layer.build(below.as_ref(), Sources::Raw)?;
        below = Some(handle.resource());
        handles.push(handle);
    }
    let resource = below.ok_or_else(|| Error::invalid("resource", "an empty stack"))?;
    let kind = kind(name)?;
    let (setup, pool_sizes, arena_size) = (kind.describe)(target, options, &handles);
    Ok(BuiltStack {
        name: plan.name.to_string(),
        resource,
        setup,
        rounding: plan.rounding,
        largest_request: plan.largest_request,
        pool_sizes,
        arena_size,
        simulated_device: plan.simulated_device,
        handles,
    })
}

/// Bytes in binary units for setup lines ("512.00 MiB"): the report floor's one formatter.
pub use crate::report::human_bytes as human;

#[cfg(test)]
mod tests;
