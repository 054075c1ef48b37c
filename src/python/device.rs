//! Driver and device queries (`python -m rrmm info`, `available_device_memory`, switching the
//! current device for `reinitialize`).

use crate::Error;
use pyo3::prelude::*;

use super::errors::py_result;

/// The current device's ordinal (CUDA's `getDevice`).
#[pyfunction]
fn _current_device() -> usize {
    crate::current_device_ordinal()
}

/// `(free, total)` bytes of the current device.
#[pyfunction]
fn available_device_memory(py: Python<'_>) -> PyResult<(usize, usize)> {
    device_memory_info(py, crate::current_device_ordinal())
}

/// `device_memory_info(device) -> (free, total)`: `cuMemGetInfo` of device `device`, with its
/// primary context current for the call.
#[pyfunction]
fn device_memory_info(py: Python<'_>, device: usize) -> PyResult<(usize, usize)> {
    py_result(py.detach(|| crate::cuda::device_memory_info(device)))
}

/// rrmm: every managed-memory cache of device `device` (default: the current one) gives back
/// what it keeps (as when an allocation there runs out of memory); the bytes given back.
#[pyfunction]
#[pyo3(signature = (device=None))]
fn release_caches(py: Python<'_>, device: Option<usize>) -> usize {
    let device = device.unwrap_or_else(crate::current_device_ordinal);
    py.detach(|| crate::pressure::relieve(crate::pressure::Place::Device(device)))
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

/// rrmm: the host NUMA node closest to device `device` as the driver reports it (where pinned
/// memory for it is placed), and the NUMA nodes the kernel lists; the node is `None` where the
/// driver does not say.
#[pyfunction]
fn host_numa_node(device: usize) -> (Option<u32>, usize) {
    (
        crate::cuda::host_numa_node(device),
        crate::os::host_pages::numa_node_count(),
    )
}

crate::python::register_items! {
    functions: host_numa_node, _current_device, available_device_memory,
        release_caches, device_memory_info, _set_device, driver_available, driver_error,
        driver_version, device_count, device_name;
}
