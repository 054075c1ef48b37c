//! The one wrapper: a Rust resource with its concrete type (a [`Handle`] of the stack builder)
//! becomes the Python object of its `rrmm.mr` class, over the Python object of its upstream, so
//! a stack made in Rust is the same first-class object a stack made from Python is (methods,
//! `upstream_mr`, a fallback's `alternate_mr`).

use crate::stack::Handle;
use crate::SharedResource;
use parking_lot::Mutex;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::PyClass;

use super::adaptors::{
    FallbackResourceAdaptor, LimitingResourceAdaptor, LoggingResourceAdaptor,
    StatisticsResourceAdaptor, TrackingResourceAdaptor,
};
use super::arena::ArenaMemoryResource;
use super::expandable::ExpandableMemoryResource;
use super::resource::{over_upstream, sub, DeviceMemoryResource, UpstreamResourceAdaptor};
use super::source_resources::{
    CudaAsyncMemoryResource, CudaMemoryResource, ManagedMemoryResource, PinnedHostMemoryResource,
    SimulatedMemoryResource,
};
use super::suballocators::{
    suballocator_keeping, BinningMemoryResource, FixedSizeMemoryResource, PoolMemoryResource,
};
use super::tiers::{PeerMemoryResource, TieredMemoryResource};

/// The object of a class right below `DeviceMemoryResource`.
fn source<T>(py: Python<'_>, init: PyClassInitializer<T>) -> PyResult<Py<DeviceMemoryResource>>
where
    T: PyClass<BaseType = DeviceMemoryResource>,
{
    Ok(Bound::new(py, init)?.into_super().unbind())
}

/// The object of a class over an upstream.
fn over<T>(py: Python<'_>, init: PyClassInitializer<T>) -> PyResult<Py<DeviceMemoryResource>>
where
    T: PyClass<BaseType = UpstreamResourceAdaptor>,
{
    Ok(Bound::new(py, init)?.into_super().into_super().unbind())
}

/// The Python object of `handle` over `upstream` (the object of the resource below it; `None`
/// for a source resource). Its Rust resource is `handle`'s ([`Handle::resource`]).
///
/// # Errors
/// ValueError for an adaptor or suballocator without its upstream object; what making a Python
/// object raises.
pub(super) fn wrap(
    py: Python<'_>,
    handle: &Handle,
    upstream: Option<Py<DeviceMemoryResource>>,
) -> PyResult<Py<DeviceMemoryResource>> {
    let inner = handle.resource();
    let up = || {
        upstream.ok_or_else(|| {
            PyValueError::new_err(format!("a {handle:?} resource needs its upstream object"))
        })
    };
    match handle {
        Handle::Cuda(_) => source(py, sub(CudaMemoryResource, inner)),
        Handle::CudaAsync(_, pool_handle) => source(
            py,
            sub(
                CudaAsyncMemoryResource {
                    pool_handle: *pool_handle,
                },
                inner,
            ),
        ),
        Handle::Managed(managed) => source(
            py,
            sub(
                ManagedMemoryResource {
                    managed: Some(managed.clone()),
                },
                inner,
            ),
        ),
        Handle::Simulated(sim) => {
            source(py, sub(SimulatedMemoryResource { sim: sim.clone() }, inner))
        }
        Handle::PinnedHost(_, pinned) => source(
            py,
            sub(
                PinnedHostMemoryResource {
                    pinned: pinned.clone(),
                },
                inner,
            ),
        ),
        Handle::Expandable(mr) => source(
            py,
            PyClassInitializer::from(DeviceMemoryResource::init(inner))
                .add_subclass(ExpandableMemoryResource { mr: mr.clone() }),
        ),
        Handle::Pool(pool, _) => over(
            py,
            suballocator_keeping(up()?, pool.clone(), |pool| PoolMemoryResource { pool }),
        ),
        Handle::Arena(arena) => over(
            py,
            suballocator_keeping(up()?, arena.clone(), |arena| ArenaMemoryResource { arena }),
        ),
        Handle::FixedSize(fixed) => over(
            py,
            suballocator_keeping(up()?, fixed.clone(), |fixed| FixedSizeMemoryResource {
                fixed,
            }),
        ),
        Handle::Binning(binning) => over(
            py,
            suballocator_keeping(up()?, binning.clone(), |binning| BinningMemoryResource {
                binning,
                bin_mrs: Mutex::new(Vec::new()),
            }),
        ),
        Handle::Fallback(fallback, alternate) => {
            let alternate = side(py, alternate)?;
            over(
                py,
                over_upstream(
                    FallbackResourceAdaptor {
                        fallback: fallback.clone(),
                        alternate,
                    },
                    up()?,
                    inner,
                ),
            )
        }
        Handle::Peer(_, peer) => source(
            py,
            sub(
                PeerMemoryResource {
                    peer: *peer,
                    device: handle.resource().device().unwrap_or(0),
                },
                inner,
            ),
        ),
        Handle::Tiered(tiered, further) => {
            let further = further
                .iter()
                .map(|h| side(py, h))
                .collect::<PyResult<Vec<_>>>()?;
            over(
                py,
                TieredMemoryResource::keeping(up()?, tiered.clone(), further),
            )
        }
        Handle::Limit(limiting) => over(
            py,
            over_upstream(
                LimitingResourceAdaptor {
                    limiting: limiting.clone(),
                },
                up()?,
                inner,
            ),
        ),
        Handle::Logging(logging) => over(
            py,
            over_upstream(
                LoggingResourceAdaptor {
                    logging: logging.clone(),
                },
                up()?,
                inner,
            ),
        ),
        Handle::Statistics(stats) => over(
            py,
            over_upstream(
                StatisticsResourceAdaptor {
                    stats: stats.clone(),
                },
                up()?,
                inner,
            ),
        ),
        Handle::Tracking(tracking) => over(
            py,
            over_upstream(
                TrackingResourceAdaptor {
                    tracking: tracking.clone(),
                },
                up()?,
                inner,
            ),
        ),
        Handle::Other(mr) if handle.built_over().is_none() => unknown_source(py, mr.clone()),
        Handle::Other(_) => Ok(Bound::new(py, UpstreamResourceAdaptor::init(up()?, inner))?
            .into_super()
            .unbind()),
    }
}

/// The object of a fallback's alternate or of a tier after the first: a source's own object,
/// or the object of a resource over its upstreams ([`wrap_resource`]: a pool set from Rust as
/// the alternate comes back over its memory).
fn side(py: Python<'_>, handle: &Handle) -> PyResult<Py<DeviceMemoryResource>> {
    match handle.built_over() {
        Some(_) => wrap_resource(py, handle.resource()),
        None => wrap(py, handle, None),
    }
}

/// A Python object for a Rust resource that was not made from Python: the object of its own
/// class where [`Handle::of_resource`] knows its type (a pool set from Rust is a
/// `PoolMemoryResource` over its upstream's object, a statistics adaptor a
/// `StatisticsResourceAdaptor`, a fallback a `FallbackResourceAdaptor` with its alternate's
/// object, a managed cache the full object); another resource over one upstream is an
/// `UpstreamResourceAdaptor` whose `upstream_mr` is its upstream's object, all the way down (a
/// stack built in Rust comes back with its upstreams). The walk down is a loop over at most
/// [`MAX_STACK_DEPTH`](crate::resource::graph::MAX_STACK_DEPTH) levels; a fallback's alternate or
/// a further tier is wrapped the same way (as deep as the graph, which construction bounds).
pub(super) fn wrap_resource(
    py: Python<'_>,
    mr: SharedResource,
) -> PyResult<Py<DeviceMemoryResource>> {
    let mut below: Option<Py<DeviceMemoryResource>> = None;
    for handle in chain_of(mr).into_iter().rev() {
        below = Some(match (handle.built_over(), below.take()) {
            // Cut short at the depth bound: the resource stands alone.
            (Some(_), None) => unknown_source(py, handle.resource())?,
            (_, up) => wrap(py, &handle, up)?,
        });
    }
    below.ok_or_else(|| PyValueError::new_err("no resource to wrap"))
}

/// `mr` and the resources below it, top to bottom, each with its handle: down through each
/// one's [`Handle::built_over`] until a source (of a known class or none) or one with several
/// upstreams and no known class; at most `MAX_STACK_DEPTH` long.
fn chain_of(mr: SharedResource) -> Vec<Handle> {
    let mut chain = Vec::new();
    let mut next = Some(mr);
    while let Some(mr) = next.take() {
        let handle = Handle::of_resource_or_other(&mr);
        if chain.len() + 1 < crate::resource::graph::MAX_STACK_DEPTH {
            next = handle.built_over();
        }
        chain.push(handle);
    }
    chain
}

/// The names of [`chain_of`]'s resources (for tests).
#[cfg(test)]
pub(super) fn chain_of_names(mr: SharedResource) -> Vec<&'static str> {
    chain_of(mr).iter().map(|h| h.resource().name()).collect()
}

/// The object of a source resource whose class the bindings do not know from its type: a
/// managed resource without a cache (its type says so) is a `ManagedMemoryResource` whose
/// cache is not reachable; any other a `DeviceMemoryResource`.
fn unknown_source(py: Python<'_>, mr: SharedResource) -> PyResult<Py<DeviceMemoryResource>> {
    let managed = mr
        .as_any()
        .is_some_and(|a| a.is::<crate::resource::UncachedManagedMemoryResource>());
    let base_init = PyClassInitializer::from(DeviceMemoryResource::init(mr));
    if managed {
        return Ok(
            Bound::new(py, base_init.add_subclass(ManagedMemoryResource::unknown()))?
                .into_super()
                .unbind(),
        );
    }
    Py::new(py, base_init)
}
