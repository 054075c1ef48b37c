//! The copies of `rrmm.DeviceBuffer` and the pointer copy functions of
//! `rrmm.pylibrmm.device_buffer`: every copy goes through [`copy`] (the GIL released, simulated
//! memory refused); user addresses are checked by `pointers` first.

use crate::container::copy_bytes;
use crate::cuda::Stream as RawStream;
use crate::os::host_memory::Access;
use crate::resource::MemoryKind;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use super::PyDeviceBuffer;
use crate::python::edge::host_buffer::HostBuffer;
use crate::python::edge::pointers;
use crate::python::edge::stream::StreamArg;
use crate::python::errors::py_result;
use crate::python::resources::convert::arg;

/// Whether `obj` is an `rrmm.HostBuffer` (its class says so), whose copies queue on a stream.
pub(super) fn is_host_buffer(obj: &Bound<'_, PyAny>) -> bool {
    obj.get_type()
        .getattr("__rrmm_host_buffer__")
        .is_ok_and(|v| v.is_truthy().unwrap_or(false))
}

/// The memory kind used to copy raw pointers: device memory with a driver; without one the only
/// memory that exists is host memory.
fn raw_kind() -> MemoryKind {
    if crate::cuda::driver_available() {
        MemoryKind::Device
    } else {
        MemoryKind::Host
    }
}

/// Copies with the GIL released. A range in simulated memory (a raw pointer from a
/// `SimulatedMemoryResource`, or a buffer over one) is an error, never a dereference; a copy of
/// no bytes passes the checks and [`copy_bytes`] returns at once.
///
/// Safety contract (checked by the callers): both ranges are valid for `bytes` bytes: a live
/// buffer or a held host view, or a user's raw range that [`pointers::check_user_range`] vouched
/// for.
pub(super) fn copy(
    py: Python<'_>,
    dst: usize,
    src: usize,
    bytes: usize,
    stream: RawStream,
    kind: MemoryKind,
) -> PyResult<()> {
    py_result(pointers::check_copyable("destination", dst, bytes))?;
    py_result(pointers::check_copyable("source", src, bytes))?;
    py_result(py.detach(|| {
        // SAFETY: the callers pass ranges they hold (a live buffer, a held host view) or user
        // ranges that `pointers::check_user_range` found in CUDA's or rrmm's allocations.
        unsafe { copy_bytes(dst, src, bytes, stream, kind) }
    }))
}

fn numpy(py: Python<'_>) -> Option<&Bound<'_, PyModule>> {
    // Why process-wide: numpy is imported once; a module is the interpreter's anyway.
    static NUMPY: PyOnceLock<Option<Py<PyModule>>> = PyOnceLock::new();
    NUMPY
        .get_or_init(py, || py.import("numpy").ok().map(Bound::unbind))
        .as_ref()
        .map(|m| m.bind(py))
}

/// A new host array of `size` bytes: a numpy `uint8` array, or a `bytearray` without numpy.
fn host_array(py: Python<'_>, size: usize) -> PyResult<Bound<'_, PyAny>> {
    match numpy(py) {
        Some(np) => np.call_method1("empty", (size, "u1")),
        None => Ok(pyo3::types::PyByteArray::new(py, &vec![0u8; size]).into_any()),
    }
}

impl PyDeviceBuffer {
    /// The copy to host memory of `copy_to_host` (into `ary`, or a new array), waited for.
    pub(super) fn host_copy<'py>(
        &self,
        py: Python<'py>,
        ary: Option<Bound<'py, PyAny>>,
        stream: RawStream,
    ) -> PyResult<Bound<'py, PyAny>> {
        let size = self.inner().size();
        let ary = match ary {
            Some(a) if !a.is_none() => a,
            _ => host_array(py, size)?,
        };
        let host = HostBuffer::get(&ary, true)?;
        if host.len() < size {
            return Err(PyValueError::new_err(format!(
                "Argument `ary` is too small: {} bytes, need {size}",
                host.len()
            )));
        }
        copy(
            py,
            host.addr(),
            self.inner().ptr(),
            size,
            stream,
            self.kind(),
        )?;
        drop(host);
        Ok(ary)
    }
}

/// The device address and byte count of a 1-D contiguous `__cuda_array_interface__` object.
pub(super) fn cai_ptr_nbytes(obj: &Bound<'_, PyAny>) -> PyResult<(usize, usize)> {
    let cai = obj.getattr("__cuda_array_interface__").map_err(|_| {
        PyValueError::new_err("Expected object to support `__cuda_array_interface__` protocol")
    })?;
    let shape: Vec<usize> = cai.get_item("shape")?.extract()?;
    let typestr: String = cai.get_item("typestr")?.extract()?;
    let itemsize: usize = typestr
        .get(2..)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| PyValueError::new_err(format!("bad typestr {typestr:?}")))?;
    if shape.len() > 1 {
        return Err(PyValueError::new_err(format!(
            "Only 1-D contiguous arrays are supported, got {}-D array",
            shape.len()
        )));
    }
    if let Ok(strides) = cai.get_item("strides") {
        if !strides.is_none() {
            let strides: Vec<isize> = strides.extract()?;
            if strides.first().is_some_and(|&s| s != itemsize as isize) {
                return Err(PyValueError::new_err(
                    "Only 1-D contiguous arrays are supported, got a non-contiguous array",
                ));
            }
        }
    }
    let (ptr, _readonly): (usize, bool) = cai.get_item("data")?.extract()?;
    let count = shape.first().copied().unwrap_or(1);
    let nbytes = count.checked_mul(itemsize).ok_or_else(|| {
        PyValueError::new_err(format!(
            "`__cuda_array_interface__` describes {count} items of {itemsize} bytes, more bytes \
             than an address space holds"
        ))
    })?;
    Ok((ptr, nbytes))
}

/// An error unless the user's device range `[ptr, ptr + bytes)` (the argument `name`) can be
/// copied through with `access`: ValueError for a null pointer with bytes to copy, else as
/// [`pointers::check_user_range`] says.
fn check_device_range(
    name: &'static str,
    ptr: usize,
    bytes: usize,
    access: Access,
) -> PyResult<()> {
    if ptr == 0 && bytes > 0 {
        return Err(PyValueError::new_err(format!(
            "{name} must not be a null pointer"
        )));
    }
    py_result(pointers::check_user_range(name, ptr, bytes, access))
}

/// A new `DeviceBuffer` with the bytes of host buffer `b`.
#[pyfunction]
#[pyo3(signature = (b, stream = StreamArg::Default, mr = None))]
fn to_device(
    py: Python<'_>,
    b: &Bound<'_, PyAny>,
    stream: StreamArg<'_>,
    mr: Option<Bound<'_, PyAny>>,
) -> PyResult<PyDeviceBuffer> {
    PyDeviceBuffer::to_device(py, b, stream, mr)
}

/// Copies `hb`'s length in bytes from device address `db` into writable host buffer `hb`.
#[pyfunction]
#[pyo3(signature = (db, hb, stream = StreamArg::Default))]
fn copy_ptr_to_host(
    py: Python<'_>,
    #[pyo3(from_py_with = arg::db)] db: usize,
    hb: &Bound<'_, PyAny>,
    stream: StreamArg<'_>,
) -> PyResult<()> {
    let host = HostBuffer::get(hb, true)?;
    check_device_range("db", db, host.len(), Access::Read)?;
    copy(py, host.addr(), db, host.len(), stream.raw(), raw_kind())
}

/// Copies host buffer `hb` to device address `db`.
#[pyfunction]
#[pyo3(signature = (hb, db, stream = StreamArg::Default))]
fn copy_host_to_ptr(
    py: Python<'_>,
    hb: &Bound<'_, PyAny>,
    #[pyo3(from_py_with = arg::db)] db: usize,
    stream: StreamArg<'_>,
) -> PyResult<()> {
    let host = HostBuffer::get(hb, false)?;
    check_device_range("db", db, host.len(), Access::Write)?;
    copy(py, db, host.addr(), host.len(), stream.raw(), raw_kind())
}

/// Copies `count` bytes from device address `d_src` to device address `d_dst`.
#[pyfunction]
#[pyo3(signature = (d_src, d_dst, count, stream = StreamArg::Default))]
fn copy_device_to_ptr(
    py: Python<'_>,
    #[pyo3(from_py_with = arg::d_src)] d_src: usize,
    #[pyo3(from_py_with = arg::d_dst)] d_dst: usize,
    #[pyo3(from_py_with = arg::count)] count: usize,
    stream: StreamArg<'_>,
) -> PyResult<()> {
    if count > 0 && (d_src == 0 || d_dst == 0) {
        return Err(PyValueError::new_err("pointers must not be null"));
    }
    check_device_range("d_src", d_src, count, Access::Read)?;
    check_device_range("d_dst", d_dst, count, Access::Write)?;
    copy(py, d_dst, d_src, count, stream.raw(), raw_kind())
}

/// rrmm (for `HostBuffer`): copies `nbytes` between the start of device buffer `db` and host
/// address `host_ptr` (to the device when `to_device`), queued on `stream` without waiting,
/// ordered as the crate's asynchronous buffer copies are (after the work on the buffer's stream,
/// which then waits for the copy): the caller keeps both alive and synchronizes before reading
/// the destination (pinned host memory makes the copy asynchronous; pageable memory makes CUDA
/// finish it before returning).
/// Without a driver, host memory is copied at once.
#[pyfunction]
#[pyo3(signature = (db, host_ptr, nbytes, to_device, stream = StreamArg::Default))]
fn _copy_host_async(
    py: Python<'_>,
    db: PyRef<'_, PyDeviceBuffer>,
    host_ptr: usize,
    nbytes: usize,
    to_device: bool,
    stream: StreamArg<'_>,
) -> PyResult<()> {
    let size = db.inner().size();
    if nbytes > size {
        return Err(PyValueError::new_err(format!(
            "a copy of {nbytes} bytes does not fit a DeviceBuffer of {size}"
        )));
    }
    let access = if to_device {
        Access::Read
    } else {
        Access::Write
    };
    py_result(pointers::check_user_range(
        "host_ptr", host_ptr, nbytes, access,
    ))?;
    let (dst, src) = if to_device {
        (db.inner().ptr(), host_ptr)
    } else {
        (host_ptr, db.inner().ptr())
    };
    let kind = db.kind();
    if nbytes == 0 || kind == MemoryKind::Simulated || !crate::cuda::driver_available() {
        return copy(py, dst, src, nbytes, stream.raw(), kind);
    }
    let raw = stream.raw();
    let own = db.inner().stream();
    py_result(py.detach(|| {
        // SAFETY: the device range is the live buffer `db` (held by this call, kept alive by the
        // caller until the stream is synchronized); the host range was vouched for above; the
        // stream is a stream of the current device, as the buffer's is.
        unsafe { crate::container::copy_bytes_async(dst, src, nbytes, own, raw, kind) }
    }))
}

/// The module's own `to_device` function, kept when it is registered: a pickled buffer names it
/// (pickle finds it again as `rrmm._rrmm.to_device`), without the extension importing itself.
// Why process-wide: the extension module's function object, made once at its registration.
static TO_DEVICE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// The module's `to_device` function (see [`TO_DEVICE`]).
pub(super) fn to_device_function(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    TO_DEVICE
        .get(py)
        .map(|f| f.bind(py))
        .ok_or_else(|| PyValueError::new_err("rrmm._rrmm.to_device is not registered"))
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_copy_host_async, m)?)?;
    let to_device = wrap_pyfunction!(to_device, m)?;
    let _ = TO_DEVICE.set(m.py(), to_device.clone().into_any().unbind());
    m.add_function(to_device)?;
    m.add_function(wrap_pyfunction!(copy_ptr_to_host, m)?)?;
    m.add_function(wrap_pyfunction!(copy_host_to_ptr, m)?)?;
    m.add_function(wrap_pyfunction!(copy_device_to_ptr, m)?)?;
    Ok(())
}
