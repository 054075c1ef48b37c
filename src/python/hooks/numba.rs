//! The Numba hook's calls (`rrmm.allocators.numba`): an allocation owned by a `HookAllocation`,
//! and IPC handles of device memory.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::shared::{allocate_from, Context, HookAllocation};
use crate::python::errors::py_result;
use crate::{cuda, Error, Stream};

/// `hook_allocate(nbytes, stream, device)`: allocates `nbytes` on the raw stream handle `stream`
/// from the per-device resource of `device`. The hot path of the CuPy and Numba hooks.
#[pyfunction]
fn hook_allocate(nbytes: usize, stream: usize, device: usize) -> PyResult<HookAllocation> {
    // SAFETY: the hooks pass the framework's current stream of `device` (Numba), a live stream or
    // a default-stream handle, which the framework keeps live while it uses memory allocated on it.
    let stream = unsafe { Stream::from_raw(stream) };
    if nbytes == 0 {
        return Ok(HookAllocation::new(0, 0, device, stream, None));
    }
    let mr = py_result(super::shared::HookResource::of_device(device))?;
    // `allocate_from` keeps the one GIL rule (released when the resource may block or reach
    // Python).
    let (ptr, mr) = py_result(allocate_from(mr, device, nbytes, stream, Context::Make))?;
    Ok(HookAllocation::new(ptr, nbytes, device, stream, mr))
}

/// `ipc_mem_handle(ptr) -> (bytes, offset)`: the 64-byte `cuIpcGetMemHandle` handle of the
/// allocation containing device address `ptr` (in the current context), and `ptr`'s offset
/// from that allocation's base.
#[pyfunction]
fn ipc_mem_handle<'py>(py: Python<'py>, ptr: usize) -> PyResult<(Bound<'py, PyBytes>, usize)> {
    if ptr == 0 {
        return py_result(Err(Error::invalid(
            "ptr",
            "the null pointer has no IPC handle",
        )));
    }
    let (handle, offset) = py_result(cuda::ipc_mem_handle(ptr))?;
    Ok((PyBytes::new(py, &handle), offset))
}

crate::python::register_items! {
    functions: hook_allocate, ipc_mem_handle;
}
