//! `rrmm.DeviceBuffer` and the pointer copy functions of `rrmm.pylibrmm.device_buffer`.

use crate::container::copy_bytes;
use crate::cuda::Stream as RawStream;
use crate::os::host_memory::Access;
use crate::resource::memory_summary::explain_out_of_memory;
use crate::resource::{MemoryKind, SharedResource};
use crate::DeviceBuffer as RsBuffer;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use super::host_buffer::HostBuffer;
use super::pointers;
use super::stream::{PyStream, StreamArg};
use crate::python::errors::py_result;
use crate::python::gil::{self, CallProfile};
use crate::python::hooks::history;
use crate::python::resources::registry::current_resource;
use crate::python::resources::resource::DeviceMemoryResource;

/// Device memory of `size` bytes from a memory resource (RMM's `DeviceBuffer`), freed when the
/// object goes.
#[pyclass(
    module = "rrmm.pylibrmm.device_buffer",
    name = "DeviceBuffer",
    subclass
)]
pub(super) struct PyDeviceBuffer {
    buf: Option<RsBuffer>,
    mr: Py<DeviceMemoryResource>,
    stream: Py<PyStream>,
    /// The resource's call profile: frees (on drop) and reallocations go through `gil`.
    profile: CallProfile,
}

impl Drop for PyDeviceBuffer {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            if history::enabled() {
                let device = buf
                    .resource()
                    .device()
                    .unwrap_or(crate::current_device_ordinal());
                let stream = buf.stream().raw();
                history::record("free_completed", device, buf.ptr(), buf.size(), stream);
            }
            // A failed free cannot raise from a destructor: it is reported as CPython reports
            // exceptions in `__del__` (`sys.unraisablehook`), never swallowed.
            if let Err(e) = gil::call_anywhere(self.profile, move || buf.free()) {
                Python::attach(|py| {
                    crate::python::errors::to_pyerr(e).write_unraisable(py, None);
                });
            }
        }
    }
}

/// Whether `obj` is an `rrmm.HostBuffer` (its class says so), whose copies queue on a stream.
fn is_host_buffer(obj: &Bound<'_, PyAny>) -> bool {
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
/// `SimulatedMemoryResource`, or a buffer over one) is an error, never a dereference.
///
/// Safety contract (checked by the callers): both ranges are valid for `bytes` bytes: a live
/// buffer or a held host view, or a user's raw range that [`pointers::check_user_range`] vouched
/// for.
fn copy(
    py: Python<'_>,
    dst: usize,
    src: usize,
    bytes: usize,
    stream: RawStream,
    kind: MemoryKind,
) -> PyResult<()> {
    if bytes == 0 {
        return Ok(());
    }
    py_result(pointers::check_copyable("destination", dst, bytes))?;
    py_result(pointers::check_copyable("source", src, bytes))?;
    py_result(py.detach(|| {
        // SAFETY: the callers pass ranges they hold (a live buffer, a held host view) or user
        // ranges that `pointers::check_user_range` found in CUDA's or rrmm's allocations.
        unsafe { copy_bytes(dst, src, bytes, stream, kind) }
    }))
}

fn numpy(py: Python<'_>) -> Option<&Bound<'_, PyModule>> {
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
    fn host_copy<'py>(
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

    fn inner(&self) -> &RsBuffer {
        // A buffer is only taken in Drop.
        self.buf.as_ref().unwrap_or_else(|| unreachable!())
    }

    fn kind(&self) -> MemoryKind {
        self.inner().resource().kind()
    }

    fn make(
        py: Python<'_>,
        size: usize,
        raw: RawStream,
        stream: Bound<'_, PyStream>,
        mr: Bound<'_, DeviceMemoryResource>,
        shared: SharedResource,
    ) -> PyResult<Self> {
        let res = mr.get();
        let profile = res.profile();
        // `shared` moves into the buffer (no reference-count traffic on the round trip); an
        // out-of-memory error is explained from the resource object's own handle on it.
        let explain_from = &res.inner;
        let buf = gil::call(py, profile, move || {
            RsBuffer::new(size, raw, shared)
                .map_err(|e| explain_out_of_memory(e, explain_from, size, raw))
        });
        if let (Ok(b), true) = (&buf, history::enabled()) {
            let device = b
                .resource()
                .device()
                .unwrap_or(crate::current_device_ordinal());
            history::record("alloc", device, b.ptr(), b.size(), raw.raw());
        }
        Ok(PyDeviceBuffer {
            buf: Some(py_result(buf)?),
            mr: mr.unbind(),
            stream: stream.unbind(),
            profile,
        })
    }

    fn resource_of<'py>(
        py: Python<'py>,
        mr: Option<Bound<'py, PyAny>>,
    ) -> PyResult<(Bound<'py, DeviceMemoryResource>, SharedResource)> {
        match mr {
            Some(mr) if !mr.is_none() => {
                let mr = mr.cast_into::<DeviceMemoryResource>().map_err(|_| {
                    PyTypeError::new_err("mr must be a DeviceMemoryResource or None")
                })?;
                let shared = mr.get().inner.clone();
                Ok((mr, shared))
            }
            _ => current_resource(py),
        }
    }

    /// A new buffer holding the bytes of host buffer `b`.
    fn from_host(
        py: Python<'_>,
        b: &Bound<'_, PyAny>,
        stream: StreamArg<'_>,
        mr: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let host = HostBuffer::get(b, false)?;
        let (raw, stream) = stream.resolve(py)?;
        let (mr, shared) = Self::resource_of(py, mr)?;
        let this = Self::make(py, host.len(), raw, stream, mr, shared)?;
        copy(
            py,
            this.inner().ptr(),
            host.addr(),
            host.len(),
            raw,
            this.kind(),
        )?;
        Ok(this)
    }

    /// The buffer to switch to new memory: waits (with the GIL released, so they can finish)
    /// while copies on other threads still read it; an error after a second (a read that does
    /// not end: a callback on this very thread that resizes the buffer it is copying).
    fn borrow_to_switch<'py>(slf: &Bound<'py, Self>) -> PyResult<PyRefMut<'py, Self>> {
        let start = std::time::Instant::now();
        loop {
            if let Ok(this) = slf.try_borrow_mut() {
                return Ok(this);
            }
            if start.elapsed() > std::time::Duration::from_secs(1) {
                return Err(pyo3::exceptions::PyRuntimeError::new_err(
                    "DeviceBuffer: cannot resize or reserve while another call on the buffer is \
                     still running (on this thread: a callback inside that call?)",
                ));
            }
            slf.py().detach(std::thread::yield_now);
        }
    }

    /// `reserve` (`capacity` given: at least that much room, same size) and `resize` (a new
    /// size, room as needed); the buffer moves to `stream`. A new allocation and its copy are
    /// made while the buffer is only read (other threads may use it meanwhile, with the GIL
    /// released around the copy as the resource's profile asks); the switch to the new memory
    /// and stream is one step with the GIL held, so no Python code ever sees the buffer
    /// mutably borrowed (PyO3's "Already borrowed"); the old memory is freed after.
    fn regrow(
        slf: &Bound<'_, Self>,
        capacity: Option<usize>,
        size: usize,
        stream: StreamArg<'_>,
    ) -> PyResult<()> {
        let py = slf.py();
        let (raw, obj) = stream.resolve(py)?;
        let replacement = {
            let this = slf.borrow();
            let buf = this.inner();
            let needed = capacity.unwrap_or(size);
            if needed > buf.capacity() {
                Some(py_result(gil::call(py, this.profile, || {
                    buf.reallocated(needed, size, raw)
                }))?)
            } else {
                None
            }
        };
        let old = {
            let mut this = Self::borrow_to_switch(slf)?;
            this.stream = obj.unbind();
            let Some(buf) = this.buf.as_mut() else {
                return Ok(());
            };
            buf.set_stream(raw);
            match replacement {
                Some(new) => Some(std::mem::replace(buf, new)),
                None => {
                    py_result(buf.resize_within_capacity(size))?;
                    None
                }
            }
        };
        if let Some(old) = old {
            let profile = slf.borrow().profile;
            py_result(gil::call(py, profile, move || old.free()))?;
        }
        Ok(())
    }
}

#[pymethods]
impl PyDeviceBuffer {
    /// The garbage collector's view of the resource and stream it keeps alive.
    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        visit.call(&self.mr)?;
        visit.call(&self.stream)
    }

    /// `DeviceBuffer(*, ptr=0, size=0, stream=DEFAULT_STREAM, mr=None)`: `size` bytes from `mr`
    /// (the current device's resource by default); with `ptr`, a copy of the `size` bytes there.
    #[new]
    #[pyo3(signature = (*, ptr = 0, size = 0, stream = StreamArg::Default, mr = None))]
    fn new(
        py: Python<'_>,
        ptr: usize,
        size: usize,
        stream: StreamArg<'_>,
        mr: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let (raw, stream) = stream.resolve(py)?;
        let (mr, shared) = Self::resource_of(py, mr)?;
        if ptr != 0 {
            py_result(pointers::check_user_range("ptr", ptr, size, Access::Read))?;
        }
        let this = Self::make(py, size, raw, stream, mr, shared)?;
        if ptr != 0 && size > 0 {
            let kind = this.kind();
            copy(py, this.inner().ptr(), ptr, size, raw, kind)?;
        }
        Ok(this)
    }

    /// Bytes in the buffer.
    #[getter]
    fn size(&self) -> usize {
        self.inner().size()
    }

    /// Bytes in the buffer.
    #[getter]
    fn nbytes(&self) -> usize {
        self.inner().size()
    }

    /// The device address (0 when empty).
    #[getter]
    fn ptr(&self) -> usize {
        self.inner().ptr()
    }

    /// The resource the memory came from.
    #[getter]
    fn mr(&self, py: Python<'_>) -> Py<DeviceMemoryResource> {
        self.mr.clone_ref(py)
    }

    /// The stream the buffer is ordered on.
    #[getter]
    fn stream(&self, py: Python<'_>) -> Py<PyStream> {
        self.stream.clone_ref(py)
    }

    /// The CUDA array interface (version 0): one-dimensional `uint8`.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("data", (self.inner().ptr(), false))?;
        d.set_item("shape", (self.inner().size(),))?;
        d.set_item("strides", py.None())?;
        d.set_item("typestr", "|u1")?;
        d.set_item("version", 0)?;
        Ok(d)
    }

    fn __len__(&self) -> usize {
        self.inner().size()
    }

    fn __sizeof__(&self) -> usize {
        self.inner().size()
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        self.tobytes(py, StreamArg::Default)
    }

    fn __repr__(&self) -> String {
        format!(
            "<rrmm.DeviceBuffer size={} ptr={:#x}>",
            self.inner().size(),
            self.inner().ptr()
        )
    }

    /// Pickling: `(to_device, (host copy,))`.
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let host = self.host_copy(py, None, RawStream::DEFAULT)?;
        let to_device = py.import("rrmm._rrmm")?.getattr("to_device")?;
        PyTuple::new(py, [to_device, PyTuple::new(py, [host])?.into_any()])
    }

    /// Pickling; with protocol 5 the bytes travel as one out-of-band buffer.
    fn __reduce_ex__<'py>(&self, py: Python<'py>, protocol: i64) -> PyResult<Bound<'py, PyTuple>> {
        if protocol < 5 {
            return self.__reduce__(py);
        }
        let host = self.host_copy(py, None, RawStream::DEFAULT)?;
        let pickle_buffer = py
            .import("pickle")?
            .getattr("PickleBuffer")?
            .call1((host,))?;
        let to_device = py.import("rrmm._rrmm")?.getattr("to_device")?;
        PyTuple::new(
            py,
            [to_device, PyTuple::new(py, [pickle_buffer])?.into_any()],
        )
    }

    /// Bytes allocated (at least `size`).
    fn capacity(&self) -> usize {
        self.inner().capacity()
    }

    /// Makes room for `new_capacity` bytes, keeping the contents; the buffer moves to `stream`.
    #[pyo3(signature = (new_capacity, stream = StreamArg::Default))]
    fn reserve(slf: &Bound<'_, Self>, new_capacity: usize, stream: StreamArg<'_>) -> PyResult<()> {
        let size = slf.borrow().inner().size();
        Self::regrow(slf, Some(new_capacity), size, stream)
    }

    /// Changes the size: shrinking keeps the memory, growing past the capacity reallocates and
    /// copies; the buffer moves to `stream`.
    #[pyo3(signature = (new_size, stream = StreamArg::Default))]
    fn resize(slf: &Bound<'_, Self>, new_size: usize, stream: StreamArg<'_>) -> PyResult<()> {
        Self::regrow(slf, None, new_size, stream)
    }

    /// Prefetches managed memory to `device` (the current device by default) on `stream` (the
    /// buffer's by default); does nothing for other memory.
    #[pyo3(signature = (device = None, stream = None))]
    fn prefetch(
        &self,
        py: Python<'_>,
        device: Option<usize>,
        stream: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let raw = match stream {
            Some(s) if !s.is_none() => super::stream::stream_arg(&s)?,
            _ => self.inner().stream(),
        };
        let (ptr, size) = (self.inner().ptr(), self.inner().size());
        if ptr == 0 || size == 0 || !crate::cuda::is_managed(ptr) {
            return Ok(());
        }
        let device = device.unwrap_or_else(crate::current_device_ordinal);
        py_result(py.detach(|| {
            let _ctx = crate::cuda::ContextGuard::new(device)?;
            // SAFETY: `ptr` is managed memory of this live buffer, valid for `size` bytes.
            unsafe { crate::cuda::mem_prefetch_async(ptr, size, device, raw) }
        }))
    }

    /// A deep copy: new memory from the same resource on the same stream, same bytes.
    fn copy(&self, py: Python<'_>) -> PyResult<Self> {
        let shared = self.inner().resource().clone();
        let raw = self.inner().stream();
        let this = Self::make(
            py,
            self.inner().size(),
            raw,
            self.stream.bind(py).clone(),
            self.mr.bind(py).clone(),
            shared,
        )?;
        copy(
            py,
            this.inner().ptr(),
            self.inner().ptr(),
            self.inner().size(),
            raw,
            this.kind(),
        )?;
        Ok(this)
    }

    fn __copy__(&self, py: Python<'_>) -> PyResult<Self> {
        self.copy(py)
    }

    fn __deepcopy__(&self, py: Python<'_>, _memo: &Bound<'_, PyAny>) -> PyResult<Self> {
        self.copy(py)
    }

    /// A new buffer with the bytes of `b` (a 1-D C-contiguous `uint8` buffer or `bytes`).
    #[staticmethod]
    #[pyo3(signature = (b, stream = StreamArg::Default, mr = None))]
    fn to_device(
        py: Python<'_>,
        b: &Bound<'_, PyAny>,
        stream: StreamArg<'_>,
        mr: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        Self::from_host(py, b, stream, mr)
    }

    /// Copies the buffer to host: into `ary` (a writable 1-D `uint8` buffer at least `size`
    /// bytes long) or a new `uint8` numpy array; returns it.
    ///
    /// rrmm: into an `rrmm.HostBuffer`, the copy is queued on `stream` and not waited for (the
    /// host buffer waits for it before any host access).
    #[pyo3(signature = (ary = None, stream = StreamArg::Default))]
    fn copy_to_host<'py>(
        slf: &Bound<'py, Self>,
        ary: Option<Bound<'py, PyAny>>,
        stream: StreamArg<'py>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        if let Some(hb) = ary.as_ref().filter(|a| is_host_buffer(a)) {
            let (_, stream) = stream.resolve(py)?;
            hb.call_method1("copy_from_device", (slf, stream))?;
            return Ok(hb.clone());
        }
        slf.borrow().host_copy(py, ary, stream.raw())
    }

    /// Copies host buffer `ary` (1-D `uint8`, at most `size` bytes) to the start of the buffer.
    ///
    /// rrmm: from an `rrmm.HostBuffer`, the copy is queued on `stream` and not waited for (the
    /// host buffer waits for it before any host access and before its memory is freed).
    #[pyo3(signature = (ary, stream = StreamArg::Default))]
    fn copy_from_host<'py>(
        slf: &Bound<'py, Self>,
        ary: &Bound<'py, PyAny>,
        stream: StreamArg<'py>,
    ) -> PyResult<()> {
        let py = slf.py();
        if is_host_buffer(ary) {
            let (_, stream) = stream.resolve(py)?;
            ary.call_method1("copy_to_device", (slf, stream))?;
            return Ok(());
        }
        let this = slf.borrow();
        let host = HostBuffer::get(ary, false)?;
        if host.len() > this.inner().size() {
            return Err(PyValueError::new_err(format!(
                "Argument `hb` is too large: {} bytes into a buffer of {}",
                host.len(),
                this.inner().size()
            )));
        }
        copy(
            py,
            this.inner().ptr(),
            host.addr(),
            host.len(),
            stream.raw(),
            this.kind(),
        )
    }

    /// Copies device array `cuda_ary` (with `__cuda_array_interface__`, 1-D contiguous, at most
    /// `size` bytes) to the start of the buffer.
    #[pyo3(signature = (cuda_ary, stream = StreamArg::Default))]
    fn copy_from_device(
        &self,
        py: Python<'_>,
        cuda_ary: &Bound<'_, PyAny>,
        stream: StreamArg<'_>,
    ) -> PyResult<()> {
        let (src, nbytes) = cai_ptr_nbytes(cuda_ary)?;
        if nbytes > self.inner().size() {
            return Err(PyValueError::new_err(format!(
                "Argument `cuda_ary` is too large: {nbytes} bytes into a buffer of {}",
                self.inner().size()
            )));
        }
        // A live rrmm buffer vouches for its own range; any other object's address is checked.
        if !cuda_ary.is_instance_of::<PyDeviceBuffer>() {
            py_result(pointers::check_user_range(
                "cuda_ary",
                src,
                nbytes,
                Access::Read,
            ))?;
        }
        copy(
            py,
            self.inner().ptr(),
            src,
            nbytes,
            stream.raw(),
            self.kind(),
        )
    }

    /// The contents as `bytes`.
    #[pyo3(signature = (stream = StreamArg::Default))]
    fn tobytes<'py>(
        &self,
        py: Python<'py>,
        stream: StreamArg<'_>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let size = self.inner().size();
        let mut out = vec![0u8; size];
        copy(
            py,
            out.as_mut_ptr() as usize,
            self.inner().ptr(),
            size,
            stream.raw(),
            self.kind(),
        )?;
        Ok(PyBytes::new(py, &out))
    }
}

/// The device address and byte count of a 1-D contiguous `__cuda_array_interface__` object.
fn cai_ptr_nbytes(obj: &Bound<'_, PyAny>) -> PyResult<(usize, usize)> {
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
    PyDeviceBuffer::from_host(py, b, stream, mr)
}

/// Copies `hb`'s length in bytes from device address `db` into writable host buffer `hb`.
#[pyfunction]
#[pyo3(signature = (db, hb, stream = StreamArg::Default))]
fn copy_ptr_to_host(
    py: Python<'_>,
    db: usize,
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
    db: usize,
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
    d_src: usize,
    d_dst: usize,
    count: usize,
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

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyDeviceBuffer>()?;
    m.add_function(wrap_pyfunction!(_copy_host_async, m)?)?;
    m.add_function(wrap_pyfunction!(to_device, m)?)?;
    m.add_function(wrap_pyfunction!(copy_ptr_to_host, m)?)?;
    m.add_function(wrap_pyfunction!(copy_host_to_ptr, m)?)?;
    m.add_function(wrap_pyfunction!(copy_device_to_ptr, m)?)?;
    Ok(())
}
