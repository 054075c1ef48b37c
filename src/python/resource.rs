//! The base classes of every resource in `rrmm.mr`: `DeviceMemoryResource` (allocate,
//! deallocate, the GIL policy) and `UpstreamResourceAdaptor` (a resource over another), with the
//! initializer chains their subclasses use.

use crate::resource::{MemoryResource, SharedResource};
use pyo3::prelude::*;

use super::errors::py_result;
use super::stream::StreamArg;

/// Base class of every memory resource (RMM's `DeviceMemoryResource`).
#[pyclass(module = "rrmm.mr", name = "DeviceMemoryResource", subclass, frozen)]
pub(crate) struct DeviceMemoryResource {
    pub(crate) inner: SharedResource,
    /// Whether calls may block for long (CUDA allocation calls), so the GIL is released around
    /// them. Suballocators answer from host bookkeeping and keep the GIL; so does anything over
    /// a Python callback, which needs the GIL (releasing it there could deadlock on the
    /// suballocator's lock).
    pub(crate) release_gil: bool,
}

impl DeviceMemoryResource {
    /// A base-class initializer over a base resource `inner` (decides `release_gil` by kind).
    pub(crate) fn init(inner: SharedResource) -> Self {
        let release_gil = may_block(&*inner);
        DeviceMemoryResource { inner, release_gil }
    }

    /// A base-class initializer with an explicit `release_gil`.
    pub(crate) fn init_with(inner: SharedResource, release_gil: bool) -> Self {
        DeviceMemoryResource { inner, release_gil }
    }
}

/// The initializer of a direct subclass of `DeviceMemoryResource` over `inner`.
pub(crate) fn sub<T>(leaf: T, inner: SharedResource) -> PyClassInitializer<T>
where
    T: pyo3::PyClass<BaseType = DeviceMemoryResource>,
{
    PyClassInitializer::from(DeviceMemoryResource::init(inner)).add_subclass(leaf)
}

/// Whether a base resource's calls go to CUDA allocation calls that may block for long.
fn may_block(mr: &dyn MemoryResource) -> bool {
    matches!(
        mr.name(),
        "cuda" | "managed" | "pinned_host" | "cuda_async" | "cuda_async_view"
    )
}

#[pymethods]
impl DeviceMemoryResource {
    /// Allocates `nbytes` bytes on `stream`; returns the address.
    #[pyo3(signature = (nbytes, stream = StreamArg::Default))]
    fn allocate(&self, py: Python<'_>, nbytes: usize, stream: StreamArg<'_>) -> PyResult<usize> {
        let raw = stream.raw();
        let mr = &self.inner;
        if self.release_gil {
            py_result(py.detach(|| mr.allocate(nbytes, raw)))
        } else {
            py_result(mr.allocate(nbytes, raw))
        }
    }

    /// Returns `ptr` (allocated with the same `nbytes`) on `stream`.
    #[pyo3(signature = (ptr, nbytes, stream = StreamArg::Default))]
    fn deallocate(
        &self,
        py: Python<'_>,
        ptr: usize,
        nbytes: usize,
        stream: StreamArg<'_>,
    ) -> PyResult<()> {
        let raw = stream.raw();
        let mr = &self.inner;
        // RMM's Python contract, vouched for by the caller: `ptr` came from `allocate` on this
        // resource with `nbytes`, is freed once, after its work on `stream`. Resources that check
        // their frees (suballocators, simulated memory) raise for a broken one instead.
        if self.release_gil {
            // SAFETY: as above.
            py_result(py.detach(|| unsafe { mr.deallocate(ptr, nbytes, raw) }))
        } else {
            // SAFETY: as above.
            py_result(unsafe { mr.deallocate(ptr, nbytes, raw) })
        }
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        Ok(format!(
            "<{} ({})>",
            slf.get_type().qualname()?,
            slf.get().inner.name()
        ))
    }

    /// rrmm: the resource's short name (`"pool"`, `"cuda"`, ...).
    #[getter]
    fn _rrmm_name(&self) -> &'static str {
        self.inner.name()
    }
}

/// Base class of resources that wrap another (RMM's `UpstreamResourceAdaptor`).
#[pyclass(module = "rrmm.mr", name = "UpstreamResourceAdaptor", extends = DeviceMemoryResource, subclass, frozen)]
pub(crate) struct UpstreamResourceAdaptor {
    pub(crate) upstream: Py<DeviceMemoryResource>,
}

impl UpstreamResourceAdaptor {
    /// An initializer chain for a resource over `upstream` whose Rust resource is `inner`.
    pub(crate) fn init(
        upstream: Py<DeviceMemoryResource>,
        inner: SharedResource,
        release_gil: bool,
    ) -> PyClassInitializer<UpstreamResourceAdaptor> {
        PyClassInitializer::from(DeviceMemoryResource::init_with(inner, release_gil))
            .add_subclass(UpstreamResourceAdaptor { upstream })
    }
}

#[pymethods]
impl UpstreamResourceAdaptor {
    /// The wrapped resource.
    #[getter]
    fn upstream_mr(&self, py: Python<'_>) -> Py<DeviceMemoryResource> {
        self.upstream.clone_ref(py)
    }

    /// The wrapped resource.
    fn get_upstream(&self, py: Python<'_>) -> Py<DeviceMemoryResource> {
        self.upstream.clone_ref(py)
    }
}

/// The initializer chain `DeviceMemoryResource <- UpstreamResourceAdaptor <- leaf` of an
/// adaptor: it releases the GIL where its upstream does.
pub(crate) fn adaptor_init<T>(
    leaf: T,
    upstream: Py<DeviceMemoryResource>,
    inner: SharedResource,
) -> PyClassInitializer<T>
where
    T: pyo3::PyClass<BaseType = UpstreamResourceAdaptor>,
{
    let release_gil = upstream.get().release_gil;
    UpstreamResourceAdaptor::init(upstream, inner, release_gil).add_subclass(leaf)
}

/// The initializer chain of a suballocator: answers from host bookkeeping, keeps the GIL.
pub(crate) fn suballocator_init<T>(
    leaf: T,
    upstream: Py<DeviceMemoryResource>,
    inner: SharedResource,
) -> PyClassInitializer<T>
where
    T: pyo3::PyClass<BaseType = UpstreamResourceAdaptor>,
{
    UpstreamResourceAdaptor::init(upstream, inner, false).add_subclass(leaf)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<DeviceMemoryResource>()?;
    m.add_class::<UpstreamResourceAdaptor>()?;
    Ok(())
}
