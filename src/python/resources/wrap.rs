//! The one wrapper: a Rust resource with its concrete type (a [`Handle`] of the stack builder)
//! becomes the Python object of its `rrmm.mr` class, over the Python object of its upstream, so
//! a stack made in Rust is the same first-class object a stack made from Python is (methods,
//! `upstream_mr`, a fallback's `alternate_mr`).

use crate::stack::Handle;
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
            let alternate = wrap(py, alternate, None)?;
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
                .map(|h| wrap(py, h, None))
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
    }
}
