//! `rrmm.mr`: the resource base class, the base resources, the per-device current resource,
//! byte-size arguments and the driver queries of `python -m rrmm info`.

use crate::cuda::{ContextGuard, PoolExport, Stream as RawStream};
use crate::resource::{
    CallbackMemoryResource as RsCallback, CudaAsyncMemoryResource as RsCudaAsync,
    CudaAsyncViewMemoryResource as RsCudaAsyncView, CudaMemoryResource as RsCuda,
    ManagedMemoryResource as RsManaged, MemoryKind, MemoryResource,
    PinnedHostMemoryResource as RsPinned, SharedResource, SimulatedMemoryResource as RsSimulated,
    SystemMemoryResource as RsSystem,
};
use crate::Error;
use parking_lot::Mutex;
use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyString};
use std::sync::{Arc, OnceLock};

use super::errors::{py_result, stash_pyerr};
use super::stream::{stream_for, StreamArg};

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

/// The upstream argument of an adaptor: a `DeviceMemoryResource`, else an exception.
pub(crate) fn upstream_arg<'py>(
    obj: &Bound<'py, PyAny>,
) -> PyResult<(Py<DeviceMemoryResource>, SharedResource)> {
    if obj.is_none() {
        return Err(PyTypeError::new_err(
            "upstream_mr must be a DeviceMemoryResource, not None",
        ));
    }
    let mr = obj.cast::<DeviceMemoryResource>().map_err(|_| {
        PyTypeError::new_err(format!(
            "upstream_mr must be a DeviceMemoryResource, not {}",
            obj.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })?;
    Ok((mr.clone().unbind(), mr.get().inner.clone()))
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

/// `cudaMalloc`/`cuMemAlloc` memory of the current device.
#[pyclass(module = "rrmm.mr", name = "CudaMemoryResource", extends = DeviceMemoryResource, frozen)]
pub(crate) struct CudaMemoryResource;

#[pymethods]
impl CudaMemoryResource {
    #[new]
    fn new(py: Python<'_>) -> PyResult<PyClassInitializer<Self>> {
        let mr = py_result(py.detach(RsCuda::new))?;
        Ok(sub(CudaMemoryResource, Arc::new(mr)))
    }
}

/// Managed (unified) memory of the current device.
#[pyclass(module = "rrmm.mr", name = "ManagedMemoryResource", extends = DeviceMemoryResource, frozen)]
pub(crate) struct ManagedMemoryResource;

#[pymethods]
impl ManagedMemoryResource {
    #[new]
    fn new(py: Python<'_>) -> PyResult<PyClassInitializer<Self>> {
        let mr = py_result(py.detach(RsManaged::new))?;
        Ok(sub(ManagedMemoryResource, Arc::new(mr)))
    }
}

/// Pageable host memory from the system allocator (HMM/ATS systems can use it on the GPU).
#[pyclass(module = "rrmm.mr", name = "SystemMemoryResource", extends = DeviceMemoryResource, subclass, frozen)]
pub(crate) struct SystemMemoryResource;

#[pymethods]
impl SystemMemoryResource {
    #[new]
    fn new() -> PyClassInitializer<Self> {
        sub(SystemMemoryResource, Arc::new(RsSystem::new()))
    }
}

/// System memory that leaves `headroom` bytes of device memory free (RMM's
/// `SamHeadroomMemoryResource`); rrmm allocates system memory and records the headroom.
#[pyclass(module = "rrmm.mr", name = "SamHeadroomMemoryResource", extends = SystemMemoryResource, frozen)]
pub(crate) struct SamHeadroomMemoryResource {
    headroom: usize,
}

#[pymethods]
impl SamHeadroomMemoryResource {
    #[new]
    fn new(headroom: &Bound<'_, PyAny>) -> PyResult<PyClassInitializer<Self>> {
        let headroom = bytes_arg(headroom, "headroom")?;
        Ok(
            PyClassInitializer::from(DeviceMemoryResource::init(Arc::new(RsSystem::new())))
                .add_subclass(SystemMemoryResource)
                .add_subclass(SamHeadroomMemoryResource { headroom }),
        )
    }

    /// The device memory kept free, in bytes.
    #[getter]
    fn headroom(&self) -> usize {
        self.headroom
    }
}

/// Pinned host memory (`cuMemHostAlloc`).
#[pyclass(module = "rrmm.mr", name = "PinnedHostMemoryResource", extends = DeviceMemoryResource, frozen)]
pub(crate) struct PinnedHostMemoryResource;

#[pymethods]
impl PinnedHostMemoryResource {
    #[new]
    fn new(py: Python<'_>) -> PyResult<PyClassInitializer<Self>> {
        let mr = py_result(py.detach(RsPinned::new))?;
        Ok(sub(PinnedHostMemoryResource, Arc::new(mr)))
    }
}

/// Stream-ordered allocation from a CUDA memory pool that this resource owns.
#[pyclass(module = "rrmm.mr", name = "CudaAsyncMemoryResource", extends = DeviceMemoryResource, frozen)]
pub(crate) struct CudaAsyncMemoryResource {
    pool_handle: usize,
}

#[pymethods]
impl CudaAsyncMemoryResource {
    #[new]
    #[pyo3(signature = (initial_pool_size=None, release_threshold=None, enable_ipc=false, enable_fabric=false))]
    fn new(
        py: Python<'_>,
        initial_pool_size: Option<&Bound<'_, PyAny>>,
        release_threshold: Option<&Bound<'_, PyAny>>,
        enable_ipc: bool,
        enable_fabric: bool,
    ) -> PyResult<PyClassInitializer<Self>> {
        let initial = opt_bytes_arg(initial_pool_size, "initial_pool_size")?;
        let threshold = opt_bytes_arg(release_threshold, "release_threshold")?.map(|b| b as u64);
        let export = PoolExport {
            ipc: enable_ipc,
            fabric: enable_fabric,
        };
        let mr = py_result(py.detach(|| RsCudaAsync::new(initial, threshold, export)))?;
        Ok(sub(
            CudaAsyncMemoryResource {
                pool_handle: mr.pool_handle(),
            },
            Arc::new(mr),
        ))
    }

    /// The raw `cudaMemPool_t` handle.
    fn pool_handle(&self) -> usize {
        self.pool_handle
    }
}

/// Allocation from a CUDA memory pool owned by someone else.
#[pyclass(module = "rrmm.mr", name = "CudaAsyncViewMemoryResource", extends = DeviceMemoryResource, frozen)]
pub(crate) struct CudaAsyncViewMemoryResource {
    pool_handle: usize,
}

#[pymethods]
impl CudaAsyncViewMemoryResource {
    #[new]
    fn new(pool_handle: &Bound<'_, PyAny>) -> PyResult<PyClassInitializer<Self>> {
        // Accept ints and objects convertible with int() (cuda-python's cudaMemPool_t).
        let handle: usize = match pool_handle.extract::<usize>() {
            Ok(h) => h,
            Err(_) => pool_handle.call_method0("__int__")?.extract()?,
        };
        // SAFETY: RMM's contract for `CudaAsyncViewMemoryResource`: the caller passes a live
        // pool of the current device and keeps it live while this resource is used.
        let mr = py_result(unsafe { RsCudaAsyncView::new(handle) })?;
        Ok(sub(
            CudaAsyncViewMemoryResource {
                pool_handle: handle,
            },
            Arc::new(mr),
        ))
    }

    /// The raw `cudaMemPool_t` handle.
    fn pool_handle(&self) -> usize {
        self.pool_handle
    }
}

/// rrmm: a pretend device of `size` bytes, address ranges with nothing behind them (for
/// replays and tests; never read or write the pointers).
#[pyclass(module = "rrmm.mr", name = "SimulatedMemoryResource", extends = DeviceMemoryResource, frozen)]
pub(crate) struct SimulatedMemoryResource {
    sim: Arc<RsSimulated>,
}

#[pymethods]
impl SimulatedMemoryResource {
    #[new]
    fn new(size: &Bound<'_, PyAny>) -> PyResult<PyClassInitializer<Self>> {
        let size = bytes_arg(size, "size")?;
        let sim = Arc::new(RsSimulated::new(size));
        Ok(sub(SimulatedMemoryResource { sim: sim.clone() }, sim))
    }

    /// The pretend device's size in bytes.
    #[getter]
    fn size(&self) -> usize {
        self.sim.size()
    }

    /// Bytes allocated now.
    fn bytes_in_use(&self) -> usize {
        self.sim.bytes_in_use()
    }

    /// The most bytes allocated at once.
    fn peak_bytes_in_use(&self) -> usize {
        self.sim.peak_bytes_in_use()
    }

    /// Number of live allocations.
    fn live_allocations(&self) -> usize {
        self.sim.live_allocations()
    }
}

/// Allocation through Python functions: `allocate_func(size, stream) -> int` and
/// `deallocate_func(ptr, size, stream)`. Exceptions they raise propagate to the caller.
#[pyclass(module = "rrmm.mr", name = "CallbackMemoryResource", extends = DeviceMemoryResource, frozen)]
pub(crate) struct CallbackMemoryResource {
    allocate_func: Py<PyAny>,
    deallocate_func: Py<PyAny>,
}

#[pymethods]
impl CallbackMemoryResource {
    #[new]
    fn new(
        allocate_func: &Bound<'_, PyAny>,
        deallocate_func: &Bound<'_, PyAny>,
    ) -> PyResult<PyClassInitializer<Self>> {
        if !allocate_func.is_callable() || !deallocate_func.is_callable() {
            return Err(PyTypeError::new_err(
                "allocate_func and deallocate_func must be callable",
            ));
        }
        let alloc: Py<PyAny> = allocate_func.clone().unbind();
        let dealloc: Py<PyAny> = deallocate_func.clone().unbind();
        let (a, d) = (
            alloc.clone_ref(allocate_func.py()),
            dealloc.clone_ref(allocate_func.py()),
        );
        let allocate = Box::new(
            move |bytes: usize, stream: RawStream| -> crate::Result<usize> {
                Python::attach(|py| {
                    let call = || -> PyResult<usize> {
                        let s = stream_for(py, stream)?;
                        a.bind(py).call1((bytes, s))?.extract::<usize>()
                    };
                    call().map_err(|e| stash_pyerr(py, e, bytes))
                })
            },
        );
        let deallocate = Box::new(
            move |ptr: usize, bytes: usize, stream: RawStream| -> crate::Result<()> {
                Python::attach(|py| {
                    let call = || -> PyResult<()> {
                        let s = stream_for(py, stream)?;
                        d.bind(py).call1((ptr, bytes, s))?;
                        Ok(())
                    };
                    call().map_err(|e| stash_pyerr(py, e, bytes))
                })
            },
        );
        let mr = RsCallback::new(allocate, deallocate, MemoryKind::Device);
        Ok(sub(
            CallbackMemoryResource {
                allocate_func: alloc,
                deallocate_func: dealloc,
            },
            Arc::new(mr),
        ))
    }

    /// The allocate function.
    #[getter]
    fn allocate_func(&self, py: Python<'_>) -> Py<PyAny> {
        self.allocate_func.clone_ref(py)
    }

    /// The deallocate function.
    #[getter]
    fn deallocate_func(&self, py: Python<'_>) -> Py<PyAny> {
        self.deallocate_func.clone_ref(py)
    }
}

// ---------------------------------------------------------------------------------------------
// Byte sizes

/// Parses a byte specification as RMM's `parse_bytes`: `^([0-9]+(?:\.[0-9]*)?)[\t ]*
/// ((?i:(?:[kmgtp]i?)?b))?$`; `kb` is 1000 and `kib` 1024 bytes.
pub(crate) fn parse_byte_spec(text: &str) -> Option<usize> {
    let s = text.strip_suffix('\n').unwrap_or(text);
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if digits_end == 0 {
        return None;
    }
    let mut end = digits_end;
    let mut fraction = "";
    if s[end..].starts_with('.') {
        let rest = &s[end + 1..];
        let frac_len = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        fraction = &rest[..frac_len];
        end += 1 + frac_len;
    }
    let number = &s[..end];
    let unit = s[end..]
        .trim_start_matches([' ', '\t'])
        .to_ascii_lowercase();
    let multiplier: u128 = match unit.as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "pb" => 1_000_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        "pib" => 1 << 50,
        _ => return None,
    };
    let value: u128 = if fraction.trim_end_matches('0').is_empty() {
        let whole: u128 = s[..digits_end].parse().ok()?;
        whole.checked_mul(multiplier)?
    } else {
        let x: f64 = number.parse().ok()?;
        (x * multiplier as f64) as u128
    };
    usize::try_from(value).ok()
}

/// A size argument: an int (negative is an OverflowError) or a byte string such as `"4MiB"`;
/// a float is a TypeError.
pub(crate) fn bytes_arg(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    if obj.is_instance_of::<PyFloat>() {
        return Err(PyTypeError::new_err(format!(
            "{name} must be an int or a byte string such as \"4MiB\", not float"
        )));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        let text: String = s.extract()?;
        let text = text.as_str();
        return parse_byte_spec(text).ok_or_else(|| {
            PyValueError::new_err(format!("Could not parse '{text}' as a byte specification"))
        });
    }
    if obj.is_instance_of::<PyInt>() || obj.is_instance_of::<PyBool>() {
        return obj.extract::<usize>().map_err(|_| {
            PyOverflowError::new_err(format!(
                "{name} must be a non-negative size that fits in size_t"
            ))
        });
    }
    // Anything with __index__ (numpy integers).
    match obj.call_method0("__index__") {
        Ok(i) => bytes_arg(&i, name),
        Err(_) => Err(PyTypeError::new_err(format!(
            "{name} must be an int or a byte string, not {}",
            obj.get_type().name()?
        ))),
    }
}

/// [`bytes_arg`] where `None` means "not given".
pub(crate) fn opt_bytes_arg(obj: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<usize>> {
    match obj {
        None => Ok(None),
        Some(o) if o.is_none() => Ok(None),
        Some(o) => bytes_arg(o, name).map(Some),
    }
}

/// `parse_bytes(s)`: an int is returned as is; a string is parsed as a byte specification.
#[pyfunction]
fn parse_bytes(s: &Bound<'_, PyAny>) -> PyResult<usize> {
    if s.is_instance_of::<PyString>() || s.is_instance_of::<PyInt>() {
        bytes_arg(s, "s")
    } else {
        Err(PyTypeError::new_err(format!(
            "parse_bytes expects a str or an int, not {}",
            s.get_type().name()?
        )))
    }
}

// ---------------------------------------------------------------------------------------------
// The per-device current resource, as Python objects

type Entry = Option<(Py<DeviceMemoryResource>, SharedResource)>;

/// The Python object set for each device, with the Rust resource it was set with (to notice
/// resources set from Rust, for example by the torch hook).
static PY_TABLE: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

fn same(a: &SharedResource, b: &SharedResource) -> bool {
    std::ptr::eq(Arc::as_ptr(a) as *const (), Arc::as_ptr(b) as *const ())
}

/// The device "current" refers to; free when the machine has at most one device.
pub(crate) fn current_device() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    if *COUNT.get_or_init(crate::cuda::device_count) <= 1 {
        0
    } else {
        crate::current_device_ordinal()
    }
}

/// A Python object for a Rust resource that was not made from Python.
fn wrap(py: Python<'_>, mr: SharedResource) -> PyResult<Py<DeviceMemoryResource>> {
    let base_init = PyClassInitializer::from(DeviceMemoryResource::init(mr.clone()));
    let obj: Py<DeviceMemoryResource> = match mr.name() {
        "cuda" => Bound::new(py, base_init.add_subclass(CudaMemoryResource))?
            .into_super()
            .unbind(),
        "managed" => Bound::new(py, base_init.add_subclass(ManagedMemoryResource))?
            .into_super()
            .unbind(),
        _ => Py::new(py, base_init)?,
    };
    Ok(obj)
}

/// The resource of `device`, as a Python object and as the Rust resource.
pub(crate) fn per_device<'py>(
    py: Python<'py>,
    device: usize,
) -> PyResult<(Bound<'py, DeviceMemoryResource>, SharedResource)> {
    // One read lock when a resource is set; on first use this makes the default cuda resource.
    let rust = py_result(crate::per_device_resource(device))?;
    {
        let table = PY_TABLE.lock();
        if let Some(Some((obj, known))) = table.get(device) {
            if same(known, &rust) {
                return Ok((obj.bind(py).clone(), rust));
            }
        }
    }
    let obj = wrap(py, rust.clone())?;
    store(py, device, obj.clone_ref(py), rust.clone());
    Ok((obj.into_bound(py), rust))
}

fn store(_py: Python<'_>, device: usize, obj: Py<DeviceMemoryResource>, mr: SharedResource) {
    let old = {
        let mut table = PY_TABLE.lock();
        if table.len() <= device {
            table.resize_with(device + 1, || None);
        }
        table[device].replace((obj, mr))
    };
    // The old object is dropped here, after the lock is released (its finalizer may run code).
    drop(old);
}

/// The current device's resource.
pub(crate) fn current_resource<'py>(
    py: Python<'py>,
) -> PyResult<(Bound<'py, DeviceMemoryResource>, SharedResource)> {
    per_device(py, current_device())
}

/// `get_per_device_resource(device)`.
#[pyfunction]
fn get_per_device_resource(
    py: Python<'_>,
    device: usize,
) -> PyResult<Bound<'_, DeviceMemoryResource>> {
    Ok(per_device(py, device)?.0)
}

/// `set_per_device_resource(device, mr)`.
#[pyfunction]
fn set_per_device_resource(device: usize, mr: &Bound<'_, PyAny>) -> PyResult<()> {
    let (obj, rust) =
        upstream_arg(mr).map_err(|_| PyTypeError::new_err("mr must be a DeviceMemoryResource"))?;
    crate::set_per_device_resource(device, rust.clone());
    store(mr.py(), device, obj, rust);
    Ok(())
}

/// `get_current_device_resource()`.
#[pyfunction]
fn get_current_device_resource(py: Python<'_>) -> PyResult<Bound<'_, DeviceMemoryResource>> {
    Ok(current_resource(py)?.0)
}

/// `set_current_device_resource(mr)`.
#[pyfunction]
fn set_current_device_resource(mr: &Bound<'_, PyAny>) -> PyResult<()> {
    set_per_device_resource(current_device(), mr)
}

/// Forgets every per-device resource (used by `reinitialize`).
#[pyfunction]
fn _clear_per_device_resources(py: Python<'_>) {
    crate::clear_per_device_resources();
    let old = std::mem::take(&mut *PY_TABLE.lock());
    drop(old);
    let _ = py;
}

/// Whether a resource has been set (or made) for the current device.
#[pyfunction]
fn is_initialized() -> bool {
    crate::has_per_device_resource(current_device())
}

/// The current device's ordinal (CUDA's `getDevice`).
#[pyfunction]
fn _current_device() -> usize {
    crate::current_device_ordinal()
}

/// `(free, total)` bytes of the current device.
#[pyfunction]
fn available_device_memory(py: Python<'_>) -> PyResult<(usize, usize)> {
    _device_mem_info(py, current_device())
}

/// `(free, total)` bytes of device `device`.
#[pyfunction]
fn _device_mem_info(py: Python<'_>, device: usize) -> PyResult<(usize, usize)> {
    py_result(py.detach(|| {
        let _ctx = ContextGuard::new(device)?;
        crate::cuda::mem_get_info()
    }))
}

/// Makes device `device` current on this thread (CUDA's `setDevice`).
#[pyfunction]
fn _set_device(device: usize) -> PyResult<()> {
    py_result(crate::cuda::set_current_device(device))
}

/// Whether a CUDA driver is loaded.
#[pyfunction]
fn driver_available() -> bool {
    crate::cuda::driver_available()
}

/// Why the driver is unusable (`None` when it is usable).
#[pyfunction]
fn driver_error() -> Option<String> {
    match crate::cuda::ensure_driver() {
        Ok(()) => None,
        Err(Error::NoDriver(why)) => Some(why),
        Err(e) => Some(e.to_string()),
    }
}

/// The driver's CUDA version, `major * 1000 + minor * 10`.
#[pyfunction]
fn driver_version() -> PyResult<i32> {
    py_result(crate::cuda::driver_version())
}

/// Number of CUDA devices (0 without a driver).
#[pyfunction]
fn device_count() -> usize {
    crate::cuda::device_count()
}

/// The name of device `device`.
#[pyfunction]
fn device_name(device: usize) -> PyResult<String> {
    py_result(crate::cuda::device_name(device))
}

/// Whether device `device` has a resource set (without making one).
#[pyfunction]
fn has_per_device_resource(device: usize) -> bool {
    crate::has_per_device_resource(device)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<DeviceMemoryResource>()?;
    m.add_class::<UpstreamResourceAdaptor>()?;
    m.add_class::<CudaMemoryResource>()?;
    m.add_class::<ManagedMemoryResource>()?;
    m.add_class::<SystemMemoryResource>()?;
    m.add_class::<SamHeadroomMemoryResource>()?;
    m.add_class::<PinnedHostMemoryResource>()?;
    m.add_class::<CudaAsyncMemoryResource>()?;
    m.add_class::<CudaAsyncViewMemoryResource>()?;
    m.add_class::<SimulatedMemoryResource>()?;
    m.add_class::<CallbackMemoryResource>()?;
    m.add_function(wrap_pyfunction!(parse_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(get_per_device_resource, m)?)?;
    m.add_function(wrap_pyfunction!(set_per_device_resource, m)?)?;
    m.add_function(wrap_pyfunction!(get_current_device_resource, m)?)?;
    m.add_function(wrap_pyfunction!(set_current_device_resource, m)?)?;
    m.add_function(wrap_pyfunction!(_clear_per_device_resources, m)?)?;
    m.add_function(wrap_pyfunction!(is_initialized, m)?)?;
    m.add_function(wrap_pyfunction!(_current_device, m)?)?;
    m.add_function(wrap_pyfunction!(available_device_memory, m)?)?;
    m.add_function(wrap_pyfunction!(_device_mem_info, m)?)?;
    m.add_function(wrap_pyfunction!(_set_device, m)?)?;
    m.add_function(wrap_pyfunction!(driver_available, m)?)?;
    m.add_function(wrap_pyfunction!(driver_error, m)?)?;
    m.add_function(wrap_pyfunction!(driver_version, m)?)?;
    m.add_function(wrap_pyfunction!(device_count, m)?)?;
    m.add_function(wrap_pyfunction!(device_name, m)?)?;
    m.add_function(wrap_pyfunction!(has_per_device_resource, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_byte_spec as p;

    #[test]
    fn byte_specs_follow_rmm() {
        assert_eq!(p("4MiB"), Some(4 << 20));
        assert_eq!(p("2kib"), Some(2048));
        assert_eq!(p("2kb"), Some(2000));
        assert_eq!(p("2 KB"), Some(2000));
        assert_eq!(p("1.5KiB"), Some(1536));
        assert_eq!(p("100"), Some(100));
        assert_eq!(p("100b"), Some(100));
        assert_eq!(p("1."), Some(1));
        assert_eq!(p("2k"), None);
        assert_eq!(p(".5kb"), None);
        assert_eq!(p("-1"), None);
        assert_eq!(p("abc"), None);
        assert_eq!(p(""), None);
    }
}
