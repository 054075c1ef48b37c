//! The base classes of every resource in `rrmm.mr`: `DeviceMemoryResource` (allocate,
//! deallocate, through the one GIL helper) and `UpstreamResourceAdaptor` (a resource over another), with the
//! initializer chains their subclasses use.

use crate::resource::memory_summary::explain_out_of_memory;
use crate::resource::{Calls, SharedResource};
use pyo3::prelude::*;

use super::convert::arg;
use crate::python::edge::stream::StreamArg;
use crate::python::errors::py_result;
use crate::python::gil::{self, CallProfile};

/// Base class of every memory resource (RMM's `DeviceMemoryResource`).
#[pyclass(module = "rrmm.mr", name = "DeviceMemoryResource", subclass, frozen)]
pub(crate) struct DeviceMemoryResource {
    pub(crate) inner: SharedResource,
    /// What calls into `inner` may do (its link's [`Calls`], kept: one load per call), which
    /// decides whether they release the GIL ([`gil::call`]).
    calls: Calls,
    /// The upstream resource object this one keeps alive (`upstream_mr`), for the garbage
    /// collector's view: traversed here, in the root class only (a `__traverse__` in a class
    /// between the root and its subclasses recurses without end in PyO3 0.30 under abi3).
    pub(crate) upstream: Option<Py<DeviceMemoryResource>>,
}

impl DeviceMemoryResource {
    /// A base-class initializer over `inner`.
    pub(crate) fn init(inner: SharedResource) -> Self {
        DeviceMemoryResource {
            calls: inner.link().calls,
            inner,
            upstream: None,
        }
    }

    /// What calls into the resource may do now (the Rust resource's link's).
    #[inline]
    pub(crate) fn profile(&self) -> CallProfile {
        self.calls.get()
    }
}

/// The initializer of a direct subclass of `DeviceMemoryResource` over the source resource
/// `inner`.
pub(super) fn sub<T>(leaf: T, inner: SharedResource) -> PyClassInitializer<T>
where
    T: pyo3::PyClass<BaseType = DeviceMemoryResource>,
{
    PyClassInitializer::from(DeviceMemoryResource::init(inner)).add_subclass(leaf)
}

#[pymethods]
impl DeviceMemoryResource {
    /// The garbage collector's view of the upstream this resource keeps alive, so reference
    /// cycles through Python callbacks (a callback that refers to the pool above it) are
    /// collected.
    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        visit.call(&self.upstream)
    }

    /// Allocates `nbytes` bytes on `stream`; returns the address.
    #[pyo3(signature = (nbytes, stream = StreamArg::Default))]
    fn allocate(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = arg::nbytes)] nbytes: usize,
        stream: StreamArg<'_>,
    ) -> PyResult<usize> {
        let raw = stream.raw();
        let mr = &self.inner;
        // The allocation's door: an ask of the processes sharing the GPU runs here, outside the
        // resource's locks and without the GIL.
        py_result(
            gil::allocate(py, self.profile(), || mr.allocate(nbytes, raw))
                .map_err(|e| explain_out_of_memory(e, mr, nbytes, raw)),
        )
    }

    /// Returns `ptr` (allocated with the same `nbytes`) on `stream`.
    #[pyo3(signature = (ptr, nbytes, stream = StreamArg::Default))]
    fn deallocate(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = arg::ptr)] ptr: usize,
        #[pyo3(from_py_with = arg::nbytes)] nbytes: usize,
        stream: StreamArg<'_>,
    ) -> PyResult<()> {
        let raw = stream.raw();
        let mr = &self.inner;
        // RMM's Python contract, vouched for by the caller: `ptr` came from `allocate` on this
        // resource with `nbytes`, is freed once, after its work on `stream`. Every resource made
        // from Python checks preconditions 1 and 2 (suballocators, adaptors, simulated and
        // system memory by their own records, the CUDA source resources behind a
        // CheckedResourceAdaptor; a callback resource's functions are the user's) and raises
        // for a broken one instead.
        // SAFETY: as above.
        py_result(gil::call(py, self.profile(), || unsafe {
            mr.deallocate(ptr, nbytes, raw)
        }))
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        Ok(format!(
            "<{} ({})>",
            slf.get_type().qualname()?,
            slf.get().inner.name()
        ))
    }

    /// rrmm: puts the expandable pool under this resource to sleep (through adaptors): waits
    /// for its streams, copies its live allocations (but the `discard` buffers and those
    /// tagged "discard") to host memory and gives every page back, keeping every address.
    /// `discard_fill`: what discarded allocations hold after `restore()`, "undefined" or
    /// "zero". `to_disk`: a directory (it must exist) to write the kept bytes to, one file per
    /// live block, instead of host memory, streamed through two chunks of `disk_chunk_bytes`
    /// (default 64 MiB) of pinned memory (`O_DIRECT` where the file system takes it); the
    /// files are removed at `restore()`. Returns what it
    /// released and copied. `RuntimeError` without an expandable pool under it, or when asleep
    /// already; `MemoryError` without room on the host (or the disk); `ValueError` for a missing
    /// or unwritable directory. A refused offload changes nothing.
    #[pyo3(signature = (discard = None, discard_fill = "undefined", to_disk = None,
                        disk_chunk_bytes = None))]
    fn offload<'py>(
        &self,
        py: Python<'py>,
        discard: Option<&Bound<'py, PyAny>>,
        discard_fill: &str,
        to_disk: Option<std::path::PathBuf>,
        disk_chunk_bytes: Option<usize>,
    ) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        super::sleep::offload(
            py,
            &self.inner,
            discard,
            discard_fill,
            to_disk,
            disk_chunk_bytes,
        )
    }

    /// rrmm: makes the host pages of the next `offload()` of the expandable pool under this
    /// resource ready ahead of need (pages for all the pool holds now, from the process's host
    /// page supply, made on a thread of its own; `wait`: returns once they are made), so the
    /// first sleep copies at the link's speed. Returns the bytes asked for.
    #[pyo3(signature = (wait = false))]
    fn prepare_sleep(&self, py: Python<'_>, wait: bool) -> PyResult<usize> {
        super::sleep::prepare(py, &self.inner, wait)
    }

    /// rrmm: keeps the host pages of the next `offload()` of the expandable pool under this
    /// resource ready as the pool grows (`on`), in the background: a range for what it maps now,
    /// and a quarter larger after every growth past it (growth never waits). Returns the bytes
    /// asked for now.
    #[pyo3(signature = (on = true))]
    fn keep_sleep_ready(&self, py: Python<'_>, on: bool) -> PyResult<usize> {
        super::sleep::keep_ready(py, &self.inner, on)
    }

    /// rrmm: wakes the expandable pool under this resource: maps its pages at the same
    /// addresses and copies the bytes back. `MemoryError` when the memory cannot be mapped
    /// (nothing is lost: still asleep, call again); `RuntimeError` when awake.
    fn restore(&self, py: Python<'_>) -> PyResult<()> {
        super::sleep::restore(py, &self.inner)
    }

    /// rrmm: moves the data of the expandable pools under this resource that spilled to host
    /// pages (`ExpandableMemoryResource(spill_to_host=...)`) back to device memory at the same
    /// addresses, as far as the device has room: `buffer` (a pointer, tensor, CuPy array or
    /// buffer, with its size where it has one) limits it to that allocation's pages, `max_bytes`
    /// to that many bytes. Synchronizes every stream the pool has seen and unmaps its free
    /// pages first; call it between phases, as `offload()`. Returns a dict: promoted, spilled
    /// (still on the host), trimmed (bytes), seconds. Nothing happens when nothing spilled.
    #[pyo3(signature = (buffer = None, max_bytes = None))]
    fn promote<'py>(
        &self,
        py: Python<'py>,
        buffer: Option<&Bound<'py, PyAny>>,
        max_bytes: Option<usize>,
    ) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        super::sleep::promote(py, &self.inner, buffer, max_bytes)
    }

    /// rrmm: a safe point (no GPU work on this resource's memory is in flight or launched
    /// until it returns): the expandable pools under it that spilled move their spilled pages
    /// back to device memory at the same addresses, as far as the device has room, unless a
    /// pool's `auto_promote` is "off". Returns the summed report (as `promote()`'s); nothing
    /// happens (no synchronization) where nothing spilled.
    fn at_rest<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        super::sleep::at_rest(py, &self.inner)
    }

    /// rrmm: the host pages the expandable pools under this resource spill to (None where
    /// none spills): a dict of bytes (limit, spilled: mapped now, kept: made and free for the
    /// next spill, made, reused, promoted) and the seconds promotions spent making device
    /// memory, copying and remapping.
    fn spill_figures<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Option<Bound<'py, pyo3::types::PyDict>>> {
        super::sleep::spill_figures(py, &self.inner)
    }

    /// rrmm: whether the expandable pool under this resource is asleep.
    /// The movement state of each pool under this resource whose memory moves (its phase,
    /// who put it to sleep, where its bytes are); an empty list where none can move.
    fn movement<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, pyo3::types::PyDict>>> {
        super::sleep::movement(py, &self.inner)
    }

    #[getter]
    fn asleep(&self) -> bool {
        super::sleep::asleep(&self.inner)
    }

    /// rrmm: what `offload()` would release, copy and discard now (a dict of bytes).
    fn sleep_estimate<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        super::sleep::sleep_estimate(py, &self.inner)
    }

    /// rrmm: tags the live allocation holding `buffer` (a pointer, tensor, CuPy array or
    /// buffer; any address inside it) "keep" (offloaded and restored, the default) or
    /// "discard" (not copied) until it is freed; returns the allocation's start.
    #[pyo3(signature = (buffer, tag = "discard"))]
    fn tag(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>, tag: &str) -> PyResult<usize> {
        super::sleep::tag(py, &self.inner, buffer, tag)
    }

    /// rrmm: the resource's short name (`"pool"`, `"cuda"`, ...).
    #[getter]
    fn _rrmm_name(&self) -> &'static str {
        self.inner.name()
    }

    /// rrmm: the kind of memory it hands out: `"device"`, `"managed"`, `"pinned_host"`,
    /// `"host"` or `"simulated"`.
    #[getter]
    fn _rrmm_kind(&self) -> &'static str {
        match self.inner.kind() {
            crate::resource::MemoryKind::Device => "device",
            crate::resource::MemoryKind::Managed => "managed",
            crate::resource::MemoryKind::PinnedHost => "pinned_host",
            crate::resource::MemoryKind::Host => "host",
            crate::resource::MemoryKind::Simulated => "simulated",
        }
    }
}

/// Base class of resources that wrap another (RMM's `UpstreamResourceAdaptor`).
#[pyclass(module = "rrmm.mr", name = "UpstreamResourceAdaptor", extends = DeviceMemoryResource, subclass, frozen)]
pub(super) struct UpstreamResourceAdaptor;

impl UpstreamResourceAdaptor {
    /// An initializer chain for a resource over `upstream` whose Rust resource is `inner`.
    pub(crate) fn init(
        upstream: Py<DeviceMemoryResource>,
        inner: SharedResource,
    ) -> PyClassInitializer<UpstreamResourceAdaptor> {
        let mut base = DeviceMemoryResource::init(inner);
        base.upstream = Some(upstream);
        PyClassInitializer::from(base).add_subclass(UpstreamResourceAdaptor)
    }
}

#[pymethods]
impl UpstreamResourceAdaptor {
    /// The wrapped resource.
    #[getter]
    fn upstream_mr(slf: PyRef<'_, Self>) -> Option<Py<DeviceMemoryResource>> {
        let py = slf.py();
        slf.as_super().upstream.as_ref().map(|u| u.clone_ref(py))
    }

    /// The wrapped resource.
    fn get_upstream(slf: PyRef<'_, Self>) -> Option<Py<DeviceMemoryResource>> {
        Self::upstream_mr(slf)
    }
}

/// The initializer chain `DeviceMemoryResource <- UpstreamResourceAdaptor <- leaf` of a
/// resource over `upstream` (an adaptor or a suballocator) whose Rust resource is `inner`.
pub(super) fn over_upstream<T>(
    leaf: T,
    upstream: Py<DeviceMemoryResource>,
    inner: SharedResource,
) -> PyClassInitializer<T>
where
    T: pyo3::PyClass<BaseType = UpstreamResourceAdaptor>,
{
    UpstreamResourceAdaptor::init(upstream, inner).add_subclass(leaf)
}

/// The call profile of the resource of `slf` (a resource over an upstream).
pub(super) fn profile_of<T>(slf: &Bound<'_, T>) -> CallProfile
where
    T: pyo3::PyClass<BaseType = UpstreamResourceAdaptor>,
{
    slf.as_super().as_super().get().profile()
}

/// Runs `f`, a call into the resource of `slf` (a resource over an upstream) that takes the
/// resource's lock (its figures, its reports): with the GIL released where the resource's
/// profile asks for it, since the lock's holder may be inside a Python callback that needs the
/// GIL (see `gil`).
pub(super) fn call_locking<T, R, F>(slf: &Bound<'_, T>, f: F) -> R
where
    T: pyo3::PyClass<BaseType = UpstreamResourceAdaptor>,
    F: pyo3::marker::Ungil + FnOnce() -> R,
    R: pyo3::marker::Ungil,
{
    gil::call(slf.py(), profile_of(slf), f)
}

/// Runs `f`, a call into the resource of `slf` (a resource over an upstream) that blocks (it
/// synchronizes, or frees upstream): with the GIL released where the resource's profile, made
/// blocking, asks for it (see `gil`).
pub(super) fn call_blocking<T, R, F>(slf: &Bound<'_, T>, f: F) -> PyResult<R>
where
    T: pyo3::PyClass<BaseType = UpstreamResourceAdaptor>,
    F: pyo3::marker::Ungil + FnOnce() -> crate::Result<R>,
    R: Send,
{
    let profile = profile_of(slf).and(CallProfile::BLOCKING);
    py_result(gil::call(slf.py(), profile, f))
}

crate::python::register_items! {
    classes: DeviceMemoryResource, UpstreamResourceAdaptor;
}
