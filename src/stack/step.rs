//! One step of a stack: a resource class and its arguments, as data. Python builds a step with
//! the `rrmm.mr` class of the same name and keyword arguments (`python/rrmm/_stack.py`); Rust
//! builds it here. A step over another takes the resource below as its upstream.

use crate::adaptor::{
    FallbackResourceAdaptor, LimitingResourceAdaptor, LoggingResourceAdaptor,
    PrefetchResourceAdaptor, StatisticsResourceAdaptor, TrackingResourceAdaptor,
};
use crate::cuda::PoolExport;
use crate::error::{Error, Result};
use crate::resource::{
    CudaAsyncMemoryResource, CudaMemoryResource, PinnedHostMemoryResource, SharedResource,
    SimulatedMemoryResource, SimulatedVirtualMemory, SystemMemoryResource, DEFAULT_PAGE_SIZE,
};
use crate::suballocator::{
    ArenaMemoryResource, BinningMemoryResource, ExpandableMemoryResource, FixedSizeMemoryResource,
    ManagedMemoryResource, ManagedOptions, PoolMemoryResource, DEFAULT_BLOCKS_TO_PREALLOCATE,
    DEFAULT_RESERVE_FACTOR,
};
use std::sync::Arc;

/// A keyword argument's value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Arg {
    /// A size in bytes, or a count.
    Int(usize),
    /// A size that may be left to the resource's default (Python `None`).
    OptInt(Option<usize>),
    /// A signed exponent (binning's `-1` means "no bins").
    Exponent(i64),
    /// A flag.
    Bool(bool),
    /// A string (a file name).
    Text(String),
    /// A string that may be left to the resource's default (Python `None`).
    OptText(Option<String>),
    /// Another resource, built from its own step with nothing below it (a fallback's
    /// alternate); Python gets it as a `(class, kwargs)` pair.
    Resource(Box<Step>),
}

/// One resource of a stack: the `rrmm.mr` class name and its keyword arguments (their Python
/// names).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The class, as `rrmm.mr` names it (`"PoolMemoryResource"`).
    pub class: &'static str,
    /// Keyword arguments, by their Python names.
    pub args: Vec<(&'static str, Arg)>,
}

impl Step {
    /// A step with no arguments.
    pub fn new(class: &'static str) -> Self {
        Step {
            class,
            args: Vec::new(),
        }
    }

    /// This step with one more argument.
    #[must_use]
    pub fn arg(mut self, name: &'static str, value: Arg) -> Self {
        self.args.push((name, value));
        self
    }

    fn get(&self, name: &str) -> Option<&Arg> {
        self.args.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    fn int(&self, name: &str) -> Option<usize> {
        match self.get(name) {
            Some(Arg::Int(v)) => Some(*v),
            Some(Arg::OptInt(v)) => *v,
            _ => None,
        }
    }

    fn exponent(&self, name: &str) -> Option<u32> {
        match self.get(name) {
            Some(Arg::Exponent(e)) => u32::try_from(*e).ok(),
            _ => None,
        }
    }

    fn flag(&self, name: &str) -> Option<bool> {
        match self.get(name) {
            Some(Arg::Bool(b)) => Some(*b),
            _ => None,
        }
    }

    fn resource(&self, name: &str) -> Option<&Step> {
        match self.get(name) {
            Some(Arg::Resource(step)) => Some(step),
            _ => None,
        }
    }

    fn text(&self, name: &str) -> Option<&str> {
        match self.get(name) {
            Some(Arg::Text(t)) | Some(Arg::OptText(Some(t))) => Some(t),
            _ => None,
        }
    }
}

/// What building a step produced: the resource, and the typed handle where a report needs one.
#[derive(Clone)]
pub enum Handle {
    /// A pool, and its size when it was made (before the steps above it took chunks).
    Pool(PoolMemoryResource, usize),
    /// An arena (its size).
    Arena(ArenaMemoryResource),
    /// A fixed-size resource (its block size).
    FixedSize(FixedSizeMemoryResource),
    /// An expandable pool (mapped bytes).
    Expandable(ExpandableMemoryResource),
    /// A simulated device.
    Simulated(Arc<SimulatedMemoryResource>),
    /// A fallback adaptor, and the handle of its alternate.
    Fallback(Arc<FallbackResourceAdaptor>, Box<Handle>),
    /// Anything else.
    Other,
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            Handle::Pool(..) => "Pool",
            Handle::Arena(_) => "Arena",
            Handle::FixedSize(_) => "FixedSize",
            Handle::Expandable(_) => "Expandable",
            Handle::Fallback(..) => "Fallback",
            Handle::Simulated(_) => "Simulated",
            Handle::Other => "Other",
        };
        f.write_str(name)
    }
}

/// Builds `step` over `below` (None for a source resource) in Rust.
///
/// # Errors
/// [`Error::InvalidArgument`] for an unknown class or a step that needs an upstream and has
/// none; the resource's own errors (RMM's validation messages, out of memory, no driver).
pub fn build_step(step: &Step, below: Option<&SharedResource>) -> Result<(SharedResource, Handle)> {
    let upstream = || {
        below.cloned().ok_or_else(|| {
            Error::invalid("stack", format!("{} needs a resource below it", step.class))
        })
    };
    let other = |mr: SharedResource| Ok((mr, Handle::Other));
    match step.class {
        "CudaMemoryResource" => other(Arc::new(CudaMemoryResource::new()?)),
        "ManagedMemoryResource" => other(Arc::new(ManagedMemoryResource::with_options(
            ManagedOptions {
                cache_limit: step.int("cache_limit"),
                placement: step.flag("placement").unwrap_or(true),
            },
        )?)),
        "SystemMemoryResource" => other(Arc::new(SystemMemoryResource::new())),
        "PinnedHostMemoryResource" => other(Arc::new(PinnedHostMemoryResource::new()?)),
        "CudaAsyncMemoryResource" => other(Arc::new(CudaAsyncMemoryResource::new(
            step.int("initial_pool_size"),
            step.int("release_threshold").map(|t| t as u64),
            PoolExport {
                ipc: false,
                fabric: false,
            },
        )?)),
        "SimulatedMemoryResource" => {
            let size = step.int("size").unwrap_or(0);
            let host = step.int("host_memory").unwrap_or(0);
            let sim = Arc::new(SimulatedMemoryResource::managed(size, host));
            Ok((sim.clone(), Handle::Simulated(sim)))
        }
        "ExpandableMemoryResource" => {
            let (initial, maximum) = (step.int("initial_pool_size"), step.int("maximum_pool_size"));
            let threshold = step.int("release_threshold");
            let page = step.int("page_size");
            let pinned_host = step.flag("pinned_host").unwrap_or(false);
            let mr = match step.int("simulated_capacity") {
                Some(capacity) => ExpandableMemoryResource::new(
                    Arc::new(SimulatedVirtualMemory::new(
                        capacity,
                        capacity.saturating_mul(DEFAULT_RESERVE_FACTOR),
                        page.unwrap_or(DEFAULT_PAGE_SIZE),
                    )?),
                    initial,
                    maximum,
                    threshold,
                )?,
                None if pinned_host => ExpandableMemoryResource::on_pinned_host(
                    crate::cuda::current_device()?,
                    None,
                    page,
                    initial,
                    maximum,
                    threshold,
                )?,
                None => ExpandableMemoryResource::on_device(
                    crate::cuda::current_device()?,
                    None,
                    None,
                    initial,
                    maximum,
                    threshold,
                )?,
            };
            Ok((Arc::new(mr.clone()), Handle::Expandable(mr)))
        }
        "PoolMemoryResource" => {
            let pool = PoolMemoryResource::new(
                upstream()?,
                step.int("initial_pool_size"),
                step.int("maximum_pool_size"),
            )?;
            let made = pool.pool_size();
            Ok((Arc::new(pool.clone()), Handle::Pool(pool, made)))
        }
        "ArenaMemoryResource" => {
            let arena = ArenaMemoryResource::new(upstream()?, step.int("arena_size"), false)?;
            Ok((Arc::new(arena.clone()), Handle::Arena(arena)))
        }
        "FixedSizeMemoryResource" => {
            let fixed = FixedSizeMemoryResource::new(
                upstream()?,
                step.int("block_size")
                    .unwrap_or(crate::suballocator::DEFAULT_BLOCK_SIZE),
                step.int("blocks_to_preallocate")
                    .unwrap_or(DEFAULT_BLOCKS_TO_PREALLOCATE),
            )?;
            Ok((Arc::new(fixed.clone()), Handle::FixedSize(fixed)))
        }
        "BinningMemoryResource" => {
            let binning = BinningMemoryResource::with_blocks(
                upstream()?,
                step.exponent("min_size_exponent"),
                step.exponent("max_size_exponent"),
                step.int("blocks_to_preallocate")
                    .unwrap_or(DEFAULT_BLOCKS_TO_PREALLOCATE),
            )?;
            other(Arc::new(binning))
        }
        "LoggingResourceAdaptor" => {
            let path = match step.text("log_file_name") {
                Some(path) => path.to_string(),
                None => std::env::var("RMM_LOG_FILE").map_err(|_| {
                    Error::invalid(
                        "log_file_name",
                        "RMM logging requested without an explicit file name, but RMM_LOG_FILE \
                         is unset",
                    )
                })?,
            };
            other(Arc::new(LoggingResourceAdaptor::new(
                upstream()?,
                &path,
                false,
            )?))
        }
        "StatisticsResourceAdaptor" => other(Arc::new(StatisticsResourceAdaptor::new(upstream()?))),
        "TrackingResourceAdaptor" => {
            other(Arc::new(TrackingResourceAdaptor::new(upstream()?, false)))
        }
        "LimitingResourceAdaptor" => other(Arc::new(LimitingResourceAdaptor::new(
            upstream()?,
            step.int("allocation_limit").unwrap_or(usize::MAX),
        ))),
        "PrefetchResourceAdaptor" => other(Arc::new(PrefetchResourceAdaptor::new(upstream()?))),
        "FallbackResourceAdaptor" => {
            let alternate = step.resource("alternate_mr").ok_or_else(|| {
                Error::invalid("stack", "FallbackResourceAdaptor needs alternate_mr")
            })?;
            let (alternate, alternate_handle) = build_step(alternate, None)?;
            let fallback = Arc::new(FallbackResourceAdaptor::new(upstream()?, alternate));
            Ok((
                fallback.clone(),
                Handle::Fallback(fallback, Box::new(alternate_handle)),
            ))
        }
        class => Err(Error::invalid(
            "stack",
            format!("no resource class {class:?} in a stack"),
        )),
    }
}
