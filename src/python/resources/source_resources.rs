//! The source resources of `rrmm.mr`, those with no upstream: CUDA, managed, system (and SAM
//! headroom), pinned host, `cuda_async` (owned pool and view), simulated, and Python callbacks.

use crate::cuda::PoolExport;
use crate::resource::{
    CudaAsyncMemoryResource as RsCudaAsync, CudaAsyncViewMemoryResource as RsCudaAsyncView,
    CudaMemoryResource as RsCuda, PinnedHostMemoryResource as RsPinned,
    SimulatedMemoryResource as RsSimulated, SystemMemoryResource as RsSystem,
};
use crate::{
    CheckedResourceAdaptor, ManagedMemoryResource as RsManaged, ManagedOptions, MemoryResource,
    SharedResource,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::Arc;

use super::convert::{bytes_arg, opt_bytes_arg};
use super::resource::{sub, DeviceMemoryResource};
use crate::python::errors::py_result;
use crate::python::record::record_dict;

/// A CUDA source resource as Python drives it: behind a [`CheckedResourceAdaptor`], so a bogus,
/// double or wrong-size free from Python is a `RuntimeError` and never reaches the driver.
fn checked(mr: impl MemoryResource + 'static) -> SharedResource {
    Arc::new(CheckedResourceAdaptor::new(Arc::new(mr)))
}

/// A class with no arguments over the CUDA source resource `$rs`: made on the current device
/// without the GIL, used behind [`checked`], its calls driver calls.
macro_rules! driver_resource {
    ($(#[doc = $doc:literal])* $class:ident($rs:ident)) => {
        $(#[doc = $doc])*
        #[pyclass(module = "rrmm.mr", extends = DeviceMemoryResource, frozen)]
        pub(crate) struct $class;

        #[pymethods]
        impl $class {
            #[new]
            fn new(py: Python<'_>) -> PyResult<PyClassInitializer<Self>> {
                let mr = py_result(py.detach($rs::new))?;
                Ok(sub($class, checked(mr)))
            }
        }
    };
}

driver_resource! {
    /// `cudaMalloc`/`cuMemAlloc` memory of the current device.
    CudaMemoryResource(RsCuda)
}

/// Managed (unified) memory of the current device: allocations can exceed the device. rrmm
/// keeps freed ranges for reuse (at most `cache_limit` bytes, default a quarter of the device's
/// memory; 0 for none, as RMM) and places fresh ones of at least 2 MiB (`placement`: prefetched
/// to the device while it has room, the rest made in host memory and mapped for the device).
#[pyclass(module = "rrmm.mr", name = "ManagedMemoryResource", extends = DeviceMemoryResource, frozen)]
pub(super) struct ManagedMemoryResource {
    /// The cache; `None` for an object made around a resource set from Rust.
    pub(super) managed: Option<RsManaged>,
}

impl ManagedMemoryResource {
    /// The object for a managed resource set from Rust (its cache is not reachable from here).
    pub(crate) fn unknown() -> Self {
        ManagedMemoryResource { managed: None }
    }

    fn cache(&self) -> PyResult<&RsManaged> {
        self.managed.as_ref().ok_or_else(|| {
            pyo3::exceptions::PyRuntimeError::new_err(
                "this ManagedMemoryResource was set from Rust; its cache is not reachable here",
            )
        })
    }
}

/// The `placement` argument: True (the default) or `"ranges"`: fresh ranges placed as they are
/// allocated; False or `"off"`: nothing placed; `"blocks"`: a pool over this resource places the
/// blocks it hands out instead.
fn placement_arg(arg: Option<&Bound<'_, PyAny>>) -> PyResult<crate::resource::PlacementMode> {
    use crate::resource::PlacementMode;
    let Some(arg) = arg.filter(|a| !a.is_none()) else {
        return Ok(PlacementMode::Ranges);
    };
    if let Ok(on) = arg.cast::<pyo3::types::PyBool>() {
        return Ok(if on.is_true() {
            PlacementMode::Ranges
        } else {
            PlacementMode::Off
        });
    }
    match arg.extract::<String>() {
        Ok(text) => py_result(text.parse()),
        Err(_) => Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "placement must be a bool or \"off\", \"ranges\" or \"blocks\", not {}",
            arg.get_type().name()?
        ))),
    }
}

#[pymethods]
impl ManagedMemoryResource {
    #[new]
    #[pyo3(signature = (*, cache_limit=None, placement=None))]
    fn new(
        py: Python<'_>,
        cache_limit: Option<&Bound<'_, PyAny>>,
        placement: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let cache_limit = opt_bytes_arg(cache_limit, "cache_limit")?;
        let options = ManagedOptions {
            cache_limit,
            placement: placement_arg(placement)?,
        };
        let managed = py_result(py.detach(|| RsManaged::with_options(options)))?;
        let shared: SharedResource = Arc::new(managed.clone());
        Ok(sub(
            ManagedMemoryResource {
                managed: Some(managed),
            },
            shared,
        ))
    }

    /// rrmm: gives every cached range back (synchronizing the device first); the bytes given
    /// back.
    fn release(&self, py: Python<'_>) -> PyResult<usize> {
        let managed = self.cache()?;
        py_result(py.detach(|| managed.release()))
    }

    /// rrmm: bytes kept free for reuse now.
    fn cached_bytes(&self) -> PyResult<usize> {
        Ok(self.cache()?.cached_bytes())
    }

    /// rrmm: bytes held from the driver (handed out and cached).
    fn held_bytes(&self) -> PyResult<usize> {
        Ok(self.cache()?.held_bytes())
    }

    /// rrmm: the most bytes kept free for reuse.
    #[getter]
    fn cache_limit(&self) -> PyResult<usize> {
        Ok(self.cache()?.cache_limit())
    }

    /// rrmm: whether fresh ranges are placed (prefetched to the device, or kept on the host
    /// and mapped once the device is full).
    #[getter]
    fn placement(&self) -> PyResult<bool> {
        Ok(self.cache()?.placement())
    }

    /// rrmm: bytes placed so far, as ``(on the device, on the host)``: prefetched to the device,
    /// and made in host memory mapped for the device once the device was full (counting the
    /// blocks a pool over this resource placed).
    fn placed_bytes(&self) -> PyResult<(usize, usize)> {
        let placed = self.cache()?.placed_bytes();
        Ok((placed.device, placed.host))
    }
}

/// Pageable host memory from the system allocator (HMM/ATS systems can use it on the GPU).
#[pyclass(module = "rrmm.mr", name = "SystemMemoryResource", extends = DeviceMemoryResource, subclass, frozen)]
pub(super) struct SystemMemoryResource;

/// A new system resource, recorded so that raw copies recognise its allocations.
fn system() -> Arc<RsSystem> {
    let mr = Arc::new(RsSystem::new());
    crate::python::edge::pointers::register_system(&mr);
    mr
}

/// The object of the system resource `mr` (made in Rust: the default host resource without a
/// driver), recorded as one made from Python is.
pub(super) fn system_object(
    py: Python<'_>,
    mr: Arc<RsSystem>,
) -> PyResult<Py<DeviceMemoryResource>> {
    crate::python::edge::pointers::register_system(&mr);
    Ok(Bound::new(py, sub(SystemMemoryResource, mr))?
        .into_super()
        .unbind())
}

#[pymethods]
impl SystemMemoryResource {
    #[new]
    fn new() -> PyClassInitializer<Self> {
        sub(SystemMemoryResource, system())
    }
}

/// System memory that leaves `headroom` bytes of device memory free (RMM's
/// `SamHeadroomMemoryResource`); rrmm allocates system memory and records the headroom.
#[pyclass(module = "rrmm.mr", name = "SamHeadroomMemoryResource", extends = SystemMemoryResource, frozen)]
pub(super) struct SamHeadroomMemoryResource {
    /// The device memory kept free, in bytes.
    #[pyo3(get)]
    headroom: usize,
}

#[pymethods]
impl SamHeadroomMemoryResource {
    #[new]
    fn new(headroom: &Bound<'_, PyAny>) -> PyResult<PyClassInitializer<Self>> {
        let headroom = bytes_arg(headroom, "headroom")?;
        Ok(
            PyClassInitializer::from(DeviceMemoryResource::init(system()))
                .add_subclass(SystemMemoryResource)
                .add_subclass(SamHeadroomMemoryResource { headroom }),
        )
    }
}

/// Pinned host memory of the current device's context. rrmm: allocations of at least
/// `registered_from` bytes (default 1 MiB) are made fast (pages placed on `numa_node`, by default
/// the node the driver reports closest to the device, faulted in by several threads, then
/// registered); smaller ones come from `cudaHostAlloc`.
#[pyclass(module = "rrmm.mr", name = "PinnedHostMemoryResource", extends = DeviceMemoryResource, frozen)]
pub(super) struct PinnedHostMemoryResource {
    pub(super) pinned: Arc<RsPinned>,
}

#[pymethods]
impl PinnedHostMemoryResource {
    #[new]
    #[pyo3(signature = (*, numa_node=None, registered_from=None))]
    fn new(
        py: Python<'_>,
        numa_node: Option<u32>,
        registered_from: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let registered_from = super::convert::opt_bytes_arg(registered_from, "registered_from")?
            .unwrap_or(crate::resource::DEFAULT_REGISTERED_FROM);
        let options = crate::resource::PinnedOptions {
            numa_node,
            registered_from,
        };
        let mr = Arc::new(py_result(py.detach(|| RsPinned::with_options(options)))?);
        let inner: SharedResource = Arc::new(CheckedResourceAdaptor::new(mr.clone()));
        Ok(sub(PinnedHostMemoryResource { pinned: mr }, inner))
    }

    /// rrmm: the NUMA node of its registered ranges' pages (`None`: the process's policy).
    #[getter]
    fn numa_node(&self) -> Option<u32> {
        self.pinned.numa_node()
    }

    /// rrmm: allocations of at least this many bytes are registered ranges.
    #[getter]
    fn registered_from(&self) -> usize {
        self.pinned.registered_from()
    }

    /// rrmm: how its latest registered range (a pinned pool's chunk) was made, as a dict:
    /// seconds per step (`reserve_s`, `protect_s`, `madvise_s`, `numa_bind_s`, `touch_s`,
    /// `register_s`, `total_s`), `bytes` and `committed_bytes`, `touch_threads`,
    /// `huge_pages_advised`, `huge_page_bytes` (backed by transparent huge pages after the
    /// touch), the kernel's `thp_enabled` and `thp_defrag` settings, `numa_node_requested`,
    /// `numa_node_placed`, `numa_node_found`, `available_before` (host bytes available) and
    /// `from_supply` (the range was ready in the process's host page supply, `rrmm.host_pages`:
    /// nothing was made, `total_s` is the take); `None` before the first.
    fn startup<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.pinned
            .last_startup()
            .map(|record| record_dict(py, &record))
            .transpose()
    }

    fn __repr__(&self) -> String {
        let node = self
            .pinned
            .numa_node()
            .map_or_else(|| "the process's policy".to_string(), |n| n.to_string());
        format!(
            "<PinnedHostMemoryResource (numa_node={node}, registered_from={})>",
            self.pinned.registered_from()
        )
    }
}

/// Stream-ordered allocation from a CUDA memory pool that this resource owns.
#[pyclass(module = "rrmm.mr", name = "CudaAsyncMemoryResource", extends = DeviceMemoryResource, frozen)]
pub(super) struct CudaAsyncMemoryResource {
    pub(super) pool_handle: usize,
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
            checked(mr),
        ))
    }

    /// The raw `cudaMemPool_t` handle.
    fn pool_handle(&self) -> usize {
        self.pool_handle
    }
}

/// Allocation from a CUDA memory pool owned by someone else.
#[pyclass(module = "rrmm.mr", name = "CudaAsyncViewMemoryResource", extends = DeviceMemoryResource, frozen)]
pub(super) struct CudaAsyncViewMemoryResource {
    pool_handle: usize,
}

#[pymethods]
impl CudaAsyncViewMemoryResource {
    #[new]
    fn new(pool_handle: &Bound<'_, PyAny>) -> PyResult<PyClassInitializer<Self>> {
        // Accept ints and objects convertible with int() (cuda-python's cudaMemPool_t).
        let handle: usize = match pool_handle.extract::<usize>() {
            Ok(h) => h,
            Err(_) if pool_handle.hasattr("__int__")? => {
                pool_handle.call_method0("__int__")?.extract()?
            }
            Err(_) => {
                return Err(PyTypeError::new_err(format!(
                    "pool_handle must be an int or a cudaMemPool_t, not {}",
                    pool_handle.get_type().name()?
                )))
            }
        };
        // SAFETY: RMM's contract for `CudaAsyncViewMemoryResource`: the caller passes a live
        // pool of the current device and keeps it live while this resource is used.
        let mr = py_result(unsafe { RsCudaAsyncView::new(handle) })?;
        Ok(sub(
            CudaAsyncViewMemoryResource {
                pool_handle: handle,
            },
            checked(mr),
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
pub(super) struct SimulatedMemoryResource {
    pub(super) sim: Arc<RsSimulated>,
}

#[pymethods]
impl SimulatedMemoryResource {
    /// `size` bytes of device (rounded down to 256; 1 to 255 is a ValueError, it would be
    /// nothing); rrmm: `host_memory` bytes of host memory beyond it make it managed memory
    /// (allocations beyond the device succeed, and are counted: `beyond_device_bytes`);
    /// `shared="name"`: every process that makes the device of that name shares its bytes (as
    /// processes on one GPU do), and those that join a ledger over it join one
    /// (`rrmm.shared_gpu`), so sharing a GPU can be watched on any machine.
    #[new]
    #[pyo3(signature = (size, *, host_memory=None, shared=None))]
    fn new(
        size: &Bound<'_, PyAny>,
        host_memory: Option<&Bound<'_, PyAny>>,
        shared: Option<&str>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let size = bytes_arg(size, "size")?;
        let host = opt_bytes_arg(host_memory, "host_memory")?.unwrap_or(0);
        py_result(crate::stack::check_simulated_size("size", size))?;
        py_result(crate::stack::check_simulated_size("host_memory", host))?;
        let max = crate::resource::MAX_SIMULATED_SIZE;
        if host > max - size {
            // Each is at most the largest (checked above): together they are not.
            return Err(PyValueError::new_err(format!(
                "host_memory={host} bytes beside a device of size={size} bytes is more than \
                 simulated memory can be: the device and its host memory are at most {max} \
                 bytes (32 PiB) together, so at most {} bytes of host memory here",
                max - size
            )));
        }
        // Copy paths refuse its addresses (above every host address; nothing is behind them).
        // No window left in the simulated address space: a MemoryError, never another live
        // device's addresses.
        let sim =
            match shared {
                Some(_) if host > 0 => return Err(PyValueError::new_err(
                    "shared: a shared simulated device is plain device memory: give host_memory \
                     or shared, not both",
                )),
                Some(name) => RsSimulated::shared(size, name),
                None => RsSimulated::try_managed(size, host),
            };
        let sim = Arc::new(py_result(sim)?);
        Ok(sub(SimulatedMemoryResource { sim: sim.clone() }, sim))
    }

    /// rrmm: the name its bytes are shared by with other processes (None: its own).
    #[getter]
    fn shared(&self) -> Option<&str> {
        self.sim.shared_name()
    }

    /// rrmm: bytes of host memory beyond the device (0: a plain device).
    #[getter]
    fn host_memory(&self) -> usize {
        self.sim.host_tier()
    }

    /// rrmm: bytes in use beyond the device now and at the peak (managed memory that would
    /// live in host memory).
    fn beyond_device_bytes(&self) -> (usize, usize) {
        self.sim.beyond_device_bytes()
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

crate::python::register_items! {
    classes: CudaMemoryResource, ManagedMemoryResource, SystemMemoryResource,
        SamHeadroomMemoryResource, PinnedHostMemoryResource, CudaAsyncMemoryResource,
        CudaAsyncViewMemoryResource, SimulatedMemoryResource;
}
