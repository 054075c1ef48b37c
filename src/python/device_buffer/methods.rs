//! The Python methods of `rrmm.DeviceBuffer`: the constructor, the getters, the CUDA array
//! interface, pickling, `reserve`/`resize`, prefetching, and the copies to and from host and
//! device memory.

use crate::cuda::Stream as RawStream;
use crate::os::host_memory::Access;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use super::copies::{cai_ptr_nbytes, copy, is_host_buffer, to_device_function};
use super::PyDeviceBuffer;
use crate::python::edge::host_buffer::HostBuffer;
use crate::python::edge::pointers;
use crate::python::edge::stream::{self, PyStream, StreamArg};
use crate::python::errors::py_result;
use crate::python::resources::convert::arg;
use crate::python::resources::resource::DeviceMemoryResource;

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
        #[pyo3(from_py_with = arg::ptr)] ptr: usize,
        #[pyo3(from_py_with = arg::size)] size: usize,
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
        let to_device = to_device_function(py)?;
        PyTuple::new(
            py,
            [to_device.clone(), PyTuple::new(py, [host])?.into_any()],
        )
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
        let to_device = to_device_function(py)?;
        PyTuple::new(
            py,
            [
                to_device.clone(),
                PyTuple::new(py, [pickle_buffer])?.into_any(),
            ],
        )
    }

    /// Bytes allocated (at least `size`).
    fn capacity(&self) -> usize {
        self.inner().capacity()
    }

    /// Makes room for `new_capacity` bytes, keeping the contents; the buffer moves to `stream`.
    #[pyo3(signature = (new_capacity, stream = StreamArg::Default))]
    fn reserve(
        slf: &Bound<'_, Self>,
        #[pyo3(from_py_with = arg::new_capacity)] new_capacity: usize,
        stream: StreamArg<'_>,
    ) -> PyResult<()> {
        let size = slf.borrow().inner().size();
        Self::regrow(slf, Some(new_capacity), size, stream)
    }

    /// Changes the size: shrinking keeps the memory, growing past the capacity reallocates and
    /// copies; the buffer moves to `stream`.
    #[pyo3(signature = (new_size, stream = StreamArg::Default))]
    fn resize(
        slf: &Bound<'_, Self>,
        #[pyo3(from_py_with = arg::new_size)] new_size: usize,
        stream: StreamArg<'_>,
    ) -> PyResult<()> {
        Self::regrow(slf, None, new_size, stream)
    }

    /// Prefetches managed memory to `device` (the current device by default) on `stream` (the
    /// buffer's by default); rrmm: moves the buffer's pages that spilled to the host back to the
    /// device (`promote`); does nothing for other memory.
    #[pyo3(signature = (device = None, stream = None))]
    fn prefetch(
        &self,
        py: Python<'_>,
        device: Option<usize>,
        stream: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let raw = match stream {
            Some(s) if !s.is_none() => stream::stream_arg(&s)?,
            _ => self.inner().stream(),
        };
        let (ptr, size) = (self.inner().ptr(), self.inner().size());
        if ptr == 0 || size == 0 {
            return Ok(());
        }
        if !crate::cuda::is_managed(ptr) {
            // rrmm: pages of the buffer that spilled to the host move to the device (its pool
            // synchronizes its streams first); nothing for other memory.
            let mr = self.inner().resource().clone();
            return py_result(py.detach(|| {
                crate::suballocator::sleep::promote(&mr, Some((ptr, size)), None).map(drop)
            }));
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
    pub(super) fn to_device(
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
