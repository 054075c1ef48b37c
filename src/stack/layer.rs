//! One resource of a stack, typed: a [`Layer`] says which resource to make and with which
//! options, and [`Layer::build`] makes it over the resource below. The [`Handle`] it returns is
//! the resource with its concrete type, which the kinds' reports and the Python bindings (one
//! Python class per variant) read.

use crate::adaptor::{
    FallbackResourceAdaptor, LimitingResourceAdaptor, LoggingResourceAdaptor,
    StatisticsResourceAdaptor, Tier, TieredMemoryResource, TrackingResourceAdaptor,
};
use crate::cuda::PoolExport;
use crate::error::{Error, Result};
use crate::resource::{
    CudaAsyncMemoryResource, CudaMemoryResource, PeerMemoryResource, PinnedHostMemoryResource,
    SharedResource, SimulatedMemoryResource,
};
use crate::suballocator::{
    ArenaMemoryResource, BinningMemoryResource, ExpandableMemoryResource, ExpandableOptions,
    FixedSizeMemoryResource, ManagedMemoryResource, ManagedOptions, PoolMemoryResource,
};
use crate::{CheckedResourceAdaptor, MemoryResource};
use std::sync::Arc;

/// Where an expandable pool maps its pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpandableOn {
    /// The current device (`cuMemCreate`/`cuMemMap`).
    Device,
    /// Host memory registered with CUDA.
    PinnedHost,
    /// Simulated virtual memory of this many bytes.
    Simulated(usize),
}

/// One resource of a stack and its options; `None` is the resource's own default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layer {
    /// `cuMemAlloc` on the current device.
    Cuda,
    /// `cuMemAllocAsync` on an owned driver pool.
    CudaAsync {
        /// Bytes the pool holds from the start.
        initial_pool_size: Option<usize>,
        /// Free bytes the pool keeps across synchronizations.
        release_threshold: Option<usize>,
    },
    /// `cuMemAllocManaged`, with its cache and placement.
    Managed(ManagedOptions),
    /// A simulated device of `size` bytes, with `host_memory` bytes of host memory beyond it
    /// (managed memory) when that is not 0.
    Simulated {
        /// The device's bytes.
        size: usize,
        /// Bytes beyond the device.
        host_memory: usize,
    },
    /// Pinned host memory.
    PinnedHost,
    /// Memory of a peer GPU for the current device ([`PeerMemoryResource`]): GPU `peer`, or
    /// the first GPU with a peer link to the current one.
    Peer {
        /// The peer GPU's ordinal.
        peer: Option<usize>,
    },
    /// An expandable pool on one virtual range.
    Expandable {
        /// Where it maps.
        on: ExpandableOn,
        /// Its sizes (and on a device, the most bytes of host pages it spills to).
        options: ExpandableOptions,
    },
    /// A coalescing pool over the layer below.
    Pool {
        /// Bytes held from the start (default: half the free memory).
        initial_pool_size: Option<usize>,
        /// The most bytes held.
        maximum_pool_size: Option<usize>,
    },
    /// A global arena with per-thread and per-stream arenas over the layer below.
    Arena {
        /// The global arena's size (default: half the free memory).
        arena_size: Option<usize>,
    },
    /// Blocks of one size over the layer below.
    FixedSize {
        /// Bytes per block.
        block_size: usize,
        /// Blocks per chunk.
        blocks_to_preallocate: usize,
    },
    /// Fixed-size bins 2^min..2^max over the layer below (no bins: `None`).
    Binning {
        /// The bins' exponents.
        bins: Option<(u32, u32)>,
        /// Blocks per chunk of each bin.
        blocks_to_preallocate: usize,
    },
    /// The layer below, falling back to `alternate` (a source resource) when it is out of
    /// memory.
    Fallback {
        /// Where allocations go when the layer below is full.
        alternate: Box<Layer>,
    },
    /// Tiers ([`TieredMemoryResource`]): the layer below first (named `"device"`), then each
    /// of `tiers` (source resources, with their names) when the ones before are full.
    Tiered {
        /// The further tiers, in order: (name, source layer).
        tiers: Vec<(String, Layer)>,
    },
    /// A limit on the bytes allocated at once.
    Limit {
        /// The limit.
        allocation_limit: usize,
    },
    /// A CSV log of every allocation, to `log_file` (default `$RMM_LOG_FILE`).
    Logging {
        /// The file.
        log_file: Option<String>,
    },
    /// Counts of bytes and allocations.
    Statistics,
    /// A record of every live allocation.
    Tracking,
}

/// How [`Layer::build`] makes CUDA's own source resources (cuda, cuda_async, pinned host).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sources {
    /// As they are (Rust callers, the replay).
    Raw,
    /// Behind a [`CheckedResourceAdaptor`], as Python drives them: a bogus, double or
    /// wrong-size free is an error and never reaches the driver.
    Checked,
}

impl Sources {
    fn make(self, mr: impl MemoryResource + 'static) -> SharedResource {
        match self {
            Sources::Raw => Arc::new(mr),
            Sources::Checked => Arc::new(CheckedResourceAdaptor::new(Arc::new(mr))),
        }
    }
}

/// A built layer: the resource with its concrete type.
#[derive(Clone)]
pub enum Handle {
    /// `cuMemAlloc` (behind a check where asked).
    Cuda(SharedResource),
    /// `cuMemAllocAsync` (behind a check where asked) and its pool's handle.
    CudaAsync(SharedResource, usize),
    /// Managed memory.
    Managed(ManagedMemoryResource),
    /// A simulated device.
    Simulated(Arc<SimulatedMemoryResource>),
    /// Pinned host memory (behind a check where asked), and the resource itself.
    PinnedHost(SharedResource, Arc<PinnedHostMemoryResource>),
    /// An expandable pool.
    Expandable(ExpandableMemoryResource),
    /// A pool, and its size when it was made (before the layers above it took chunks).
    Pool(PoolMemoryResource, usize),
    /// An arena.
    Arena(ArenaMemoryResource),
    /// A fixed-size resource.
    FixedSize(FixedSizeMemoryResource),
    /// A binning resource.
    Binning(BinningMemoryResource),
    /// A fallback adaptor, and its alternate.
    Fallback(Arc<FallbackResourceAdaptor>, Box<Handle>),
    /// Memory of a peer GPU (behind a check where asked), and the peer's ordinal.
    Peer(SharedResource, usize),
    /// A tiered resource, and the handles of its tiers after the first (the layer below).
    Tiered(Arc<TieredMemoryResource>, Vec<Handle>),
    /// A limiting adaptor.
    Limit(Arc<LimitingResourceAdaptor>),
    /// A logging adaptor.
    Logging(Arc<LoggingResourceAdaptor>),
    /// A statistics adaptor.
    Statistics(Arc<StatisticsResourceAdaptor>),
    /// A tracking adaptor.
    Tracking(Arc<TrackingResourceAdaptor>),
    /// A resource whose class its type does not tell (a resource of the user's own, set from
    /// Rust): the bindings give it the base class, over its one upstream where it has one.
    Other(SharedResource),
}

impl Handle {
    /// The handle of a resource set or built in Rust, by its concrete type
    /// ([`MemoryResource::as_any`], [`MemoryResource::into_any`]) where that type has a handle
    /// of its own that the resource alone makes (cuda, managed, expandable, pool, arena,
    /// fixed-size, binning, and the statistics, logging, limiting and tracking adaptors); `None`
    /// otherwise. The one place that tells a resource's class from its type: the Python
    /// bindings make each such resource the object of its own class.
    pub fn of_resource(mr: &SharedResource) -> Option<Handle> {
        if let Some(handle) = mr.as_any().and_then(|any| Self::of_any(mr, any)) {
            return Some(handle);
        }
        let shared = mr.clone().into_any()?;
        if let Ok(a) = shared.clone().downcast::<FallbackResourceAdaptor>() {
            let alternate = Self::of_resource_or_other(a.alternate());
            return Some(Handle::Fallback(a, Box::new(alternate)));
        }
        if let Ok(t) = shared.clone().downcast::<TieredMemoryResource>() {
            let further = t
                .tiers()
                .skip(1)
                .map(|tier| Self::of_resource_or_other(&tier.resource))
                .collect();
            return Some(Handle::Tiered(t, further));
        }
        if let Ok(a) = shared.clone().downcast::<StatisticsResourceAdaptor>() {
            return Some(Handle::Statistics(a));
        }
        if let Ok(a) = shared.clone().downcast::<LoggingResourceAdaptor>() {
            return Some(Handle::Logging(a));
        }
        if let Ok(a) = shared.clone().downcast::<LimitingResourceAdaptor>() {
            return Some(Handle::Limit(a));
        }
        shared
            .downcast::<TrackingResourceAdaptor>()
            .ok()
            .map(Handle::Tracking)
    }

    /// [`of_resource`](Self::of_resource), or [`Handle::Other`] for a type without a handle.
    pub fn of_resource_or_other(mr: &SharedResource) -> Handle {
        Self::of_resource(mr).unwrap_or_else(|| Handle::Other(mr.clone()))
    }

    /// The handle of a resource whose type `any` (its [`MemoryResource::as_any`]) tells, for
    /// the types whose handle is a clone of the resource (or, for cuda, the shared resource).
    fn of_any(mr: &SharedResource, any: &dyn std::any::Any) -> Option<Handle> {
        if any.is::<CudaMemoryResource>() {
            return Some(Handle::Cuda(mr.clone()));
        }
        if let Some(m) = any.downcast_ref::<ManagedMemoryResource>() {
            return Some(Handle::Managed(m.clone()));
        }
        if let Some(e) = any.downcast_ref::<ExpandableMemoryResource>() {
            return Some(Handle::Expandable(e.clone()));
        }
        if let Some(p) = any.downcast_ref::<PoolMemoryResource>() {
            return Some(Handle::Pool(p.clone(), p.pool_size()));
        }
        if let Some(a) = any.downcast_ref::<ArenaMemoryResource>() {
            return Some(Handle::Arena(a.clone()));
        }
        if let Some(f) = any.downcast_ref::<FixedSizeMemoryResource>() {
            return Some(Handle::FixedSize(f.clone()));
        }
        if let Some(b) = any.downcast_ref::<BinningMemoryResource>() {
            return Some(Handle::Binning(b.clone()));
        }
        None
    }

    /// The resource a suballocator or adaptor handle is built over (its upstream; a fallback's
    /// primary, a tiered resource's first tier; an unknown resource's one upstream); `None` for
    /// the sources.
    pub fn built_over(&self) -> Option<SharedResource> {
        match self {
            Handle::Pool(p, _) => Some(p.upstream().clone()),
            Handle::Arena(a) => Some(a.upstream().clone()),
            Handle::FixedSize(f) => Some(f.upstream().clone()),
            Handle::Binning(b) => Some(b.upstream().clone()),
            Handle::Statistics(a) => Some(a.upstream().clone()),
            Handle::Logging(a) => Some(a.upstream().clone()),
            Handle::Limit(a) => Some(a.upstream().clone()),
            Handle::Tracking(a) => Some(a.upstream().clone()),
            Handle::Fallback(f, _) => Some(f.upstream().clone()),
            Handle::Tiered(t, _) => t.tier(0).map(|tier| tier.resource.clone()),
            Handle::Other(mr) => <[SharedResource; 1]>::try_from(mr.upstreams())
                .ok()
                .map(|[up]| up),
            _ => None,
        }
    }

    /// The resource, shared.
    pub fn resource(&self) -> SharedResource {
        match self {
            Handle::Cuda(mr)
            | Handle::CudaAsync(mr, _)
            | Handle::PinnedHost(mr, ..)
            | Handle::Peer(mr, _)
            | Handle::Other(mr) => mr.clone(),
            Handle::Managed(m) => Arc::new(m.clone()),
            Handle::Simulated(s) => s.clone(),
            Handle::Expandable(e) => Arc::new(e.clone()),
            Handle::Pool(p, _) => Arc::new(p.clone()),
            Handle::Arena(a) => Arc::new(a.clone()),
            Handle::FixedSize(f) => Arc::new(f.clone()),
            Handle::Binning(b) => Arc::new(b.clone()),
            Handle::Fallback(f, _) => f.clone(),
            Handle::Tiered(t, _) => t.clone(),
            Handle::Limit(a) => a.clone(),
            Handle::Logging(a) => a.clone(),
            Handle::Statistics(a) => a.clone(),
            Handle::Tracking(a) => a.clone(),
        }
    }
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            Handle::Cuda(_) => "Cuda",
            Handle::CudaAsync(..) => "CudaAsync",
            Handle::Managed(_) => "Managed",
            Handle::Simulated(_) => "Simulated",
            Handle::PinnedHost(..) => "PinnedHost",
            Handle::Expandable(_) => "Expandable",
            Handle::Pool(..) => "Pool",
            Handle::Arena(_) => "Arena",
            Handle::FixedSize(_) => "FixedSize",
            Handle::Binning(_) => "Binning",
            Handle::Fallback(..) => "Fallback",
            Handle::Peer(..) => "Peer",
            Handle::Tiered(..) => "Tiered",
            Handle::Other(_) => "Other",
            Handle::Limit(_) => "Limit",
            Handle::Logging(_) => "Logging",
            Handle::Statistics(_) => "Statistics",
            Handle::Tracking(_) => "Tracking",
        };
        f.write_str(name)
    }
}

impl Layer {
    /// Checks what can be checked before anything is built (a stack's plan is checked whole
    /// first, so a bad option changes nothing): a pool's sizes and an arena's, RMM's rules
    /// ([`check_pool_sizes`](crate::suballocator::check_pool_sizes),
    /// [`check_arena_size`](crate::suballocator::check_arena_size)).
    ///
    /// # Errors
    /// As those checks.
    pub fn check(&self) -> Result<()> {
        match self {
            Layer::Pool {
                initial_pool_size,
                maximum_pool_size,
            } => crate::suballocator::check_pool_sizes(*initial_pool_size, *maximum_pool_size),
            Layer::Expandable { options, .. } => crate::suballocator::check_pool_sizes(
                options.sizes.initial_pool_size,
                options.sizes.maximum_pool_size,
            ),
            Layer::Arena {
                arena_size: Some(size),
            } => crate::suballocator::check_arena_size(
                Some(*size),
                size & !(crate::resource::ALLOCATION_ALIGNMENT - 1),
            ),
            Layer::Fallback { alternate } => alternate.check(),
            Layer::Tiered { tiers } => tiers.iter().try_for_each(|(_, tier)| tier.check()),
            _ => Ok(()),
        }
    }

    /// Whether it is made over a layer below (an adaptor or a suballocator).
    pub fn needs_upstream(&self) -> bool {
        !matches!(
            self,
            Layer::Cuda
                | Layer::CudaAsync { .. }
                | Layer::Managed(_)
                | Layer::Simulated { .. }
                | Layer::PinnedHost
                | Layer::Peer { .. }
                | Layer::Expandable { .. }
        )
    }

    /// Makes this layer over `below` (None for a source resource), CUDA's source resources as
    /// `sources` says.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a layer that needs a resource below it and has none (or a
    /// source given one), a fallback whose alternate is not a source resource, and logging
    /// without a file; the resource's own errors (RMM's validation messages, out of memory, no
    /// driver).
    pub fn build(&self, below: Option<&SharedResource>, sources: Sources) -> Result<Handle> {
        let upstream = || {
            below.cloned().ok_or_else(|| {
                Error::invalid("stack", format!("{self:?} needs a resource below it"))
            })
        };
        if !self.needs_upstream() && below.is_some() {
            return Err(Error::invalid(
                "stack",
                format!("{self:?} is a source resource: nothing goes below it"),
            ));
        }
        Ok(match self {
            Layer::Cuda => Handle::Cuda(sources.make(CudaMemoryResource::new()?)),
            Layer::CudaAsync {
                initial_pool_size,
                release_threshold,
            } => {
                let mr = CudaAsyncMemoryResource::new(
                    *initial_pool_size,
                    release_threshold.map(|t| t as u64),
                    PoolExport {
                        ipc: false,
                        fabric: false,
                    },
                )?;
                let handle = mr.pool_handle();
                Handle::CudaAsync(sources.make(mr), handle)
            }
            Layer::Managed(options) => {
                Handle::Managed(ManagedMemoryResource::with_options(*options)?)
            }
            Layer::Simulated { size, host_memory } => {
                let max = crate::resource::MAX_SIMULATED_SIZE;
                if *size > max || *host_memory > max - size {
                    return Err(Error::invalid(
                        if *size > max {
                            "simulate"
                        } else {
                            "host_memory"
                        },
                        format!(
                            "{size} bytes (and {host_memory} of host memory) is larger than a \
                             simulated device can be ({max} bytes)"
                        ),
                    ));
                }
                Handle::Simulated(Arc::new(SimulatedMemoryResource::try_managed(
                    *size,
                    *host_memory,
                )?))
            }
            Layer::PinnedHost => {
                let mr = Arc::new(PinnedHostMemoryResource::new()?);
                Handle::PinnedHost(sources.make(mr.clone()), mr)
            }
            Layer::Peer { peer } => {
                let device = crate::cuda::current_device()?;
                let peer = match peer {
                    Some(p) => *p,
                    None => PeerMemoryResource::first_peer(device)?,
                };
                Handle::Peer(sources.make(PeerMemoryResource::new(device, peer)?), peer)
            }
            Layer::Expandable { on, options } => {
                use ExpandableMemoryResource as E;
                let options = *options;
                Handle::Expandable(match *on {
                    ExpandableOn::Simulated(capacity) => E::on_simulated(capacity, options)?,
                    ExpandableOn::PinnedHost => {
                        E::on_pinned_host(crate::cuda::current_device()?, options)?
                    }
                    ExpandableOn::Device => E::on_device(crate::cuda::current_device()?, options)?,
                })
            }
            Layer::Pool {
                initial_pool_size,
                maximum_pool_size,
            } => {
                let pool =
                    PoolMemoryResource::new(upstream()?, *initial_pool_size, *maximum_pool_size)?;
                let made = pool.pool_size();
                Handle::Pool(pool, made)
            }
            Layer::Arena { arena_size } => {
                Handle::Arena(ArenaMemoryResource::new(upstream()?, *arena_size, false)?)
            }
            Layer::FixedSize {
                block_size,
                blocks_to_preallocate,
            } => Handle::FixedSize(FixedSizeMemoryResource::new(
                upstream()?,
                *block_size,
                *blocks_to_preallocate,
            )?),
            Layer::Binning {
                bins,
                blocks_to_preallocate,
            } => Handle::Binning(BinningMemoryResource::with_blocks(
                upstream()?,
                bins.map(|b| b.0),
                bins.map(|b| b.1),
                *blocks_to_preallocate,
            )?),
            Layer::Fallback { alternate } => {
                if alternate.needs_upstream() {
                    return Err(Error::invalid(
                        "stack",
                        "a fallback's alternate must be a source resource",
                    ));
                }
                let alternate = alternate.build(None, sources)?;
                let fallback = Arc::new(FallbackResourceAdaptor::new(
                    upstream()?,
                    alternate.resource(),
                ));
                Handle::Fallback(fallback, Box::new(alternate))
            }
            Layer::Tiered { tiers } => {
                let mut made = vec![Tier::new("device", upstream()?)];
                let mut handles = Vec::with_capacity(tiers.len());
                for (name, layer) in tiers {
                    if layer.needs_upstream() {
                        return Err(Error::invalid(
                            "stack",
                            "a tier after the first must be a source resource",
                        ));
                    }
                    let handle = layer.build(None, sources)?;
                    made.push(Tier::new(name.clone(), handle.resource()));
                    handles.push(handle);
                }
                Handle::Tiered(Arc::new(TieredMemoryResource::new(made)?), handles)
            }
            Layer::Limit { allocation_limit } => Handle::Limit(Arc::new(
                LimitingResourceAdaptor::new(upstream()?, *allocation_limit),
            )),
            Layer::Logging { log_file } => {
                // RMM's naming: `$RMM_LOG_FILE` by default, `.dev{N}` of the current device.
                let path = crate::adaptor::log_file_for_device(
                    log_file.as_deref(),
                    crate::current_device_ordinal(),
                )?;
                Handle::Logging(Arc::new(LoggingResourceAdaptor::new(
                    upstream()?,
                    &path,
                    false,
                )?))
            }
            Layer::Statistics => {
                Handle::Statistics(Arc::new(StatisticsResourceAdaptor::new(upstream()?)))
            }
            Layer::Tracking => {
                Handle::Tracking(Arc::new(TrackingResourceAdaptor::new(upstream()?, false)))
            }
        })
    }
}
