//! `rrmm.pylibrmm.stream.Stream`: a CUDA stream handle, owning or wrapping another library's.

use crate::cuda::{OwnedStream, Stream as RawStream};
use pyo3::exceptions::{PyNotImplementedError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyTuple;
use std::sync::Arc;

use crate::python::errors::py_result;

/// A CUDA stream (RMM's `Stream`): owns a stream it created, or wraps one of rrmm, CuPy, Numba,
/// PyTorch or any object with `__cuda_stream__`, keeping that object alive.
#[pyclass(module = "rrmm.pylibrmm.stream", name = "Stream", frozen, subclass)]
pub(crate) struct PyStream {
    pub(crate) handle: RawStream,
    /// The stream rrmm created, destroyed when the last wrapper goes.
    _owned: Option<Arc<OwnedStream>>,
    /// The wrapped object of another library, kept alive with the handle.
    _owner: Option<Py<PyAny>>,
}

impl PyStream {
    /// A wrapper of a raw handle that owns nothing.
    pub(crate) fn from_raw(handle: RawStream) -> Self {
        PyStream {
            handle,
            _owned: None,
            _owner: None,
        }
    }
}

fn int_attr(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Option<usize>> {
    match obj.getattr(name) {
        Ok(value) => {
            if value.is_none() {
                return Ok(Some(0));
            }
            // Numba's `handle` is a ctypes `c_void_p`: its `.value` is the address (None for 0).
            if let Ok(inner) = value.getattr("value") {
                if inner.is_none() {
                    return Ok(Some(0));
                }
                if let Ok(v) = inner.extract::<usize>() {
                    return Ok(Some(v));
                }
            }
            Ok(Some(value.extract::<usize>()?))
        }
        Err(_) => Ok(None),
    }
}

/// The stream handle of `obj`: an rrmm `Stream`, an object with `__cuda_stream__` (protocol
/// version 0), a CuPy stream (`.ptr`), a Numba stream (`.handle`) or a PyTorch stream
/// (`.cuda_stream`). Returns the handle and whether `obj` must be kept alive.
fn handle_of(obj: &Bound<'_, PyAny>) -> PyResult<(RawStream, bool)> {
    if let Ok(stream) = obj.cast::<PyStream>() {
        return Ok((stream.get().handle, false));
    }
    if let Ok(method) = obj.getattr("__cuda_stream__") {
        let value = method.call0()?;
        let tuple = value.cast::<PyTuple>().map_err(|_| {
            PyTypeError::new_err("__cuda_stream__ must return a tuple (version, handle)")
        })?;
        if tuple.len() != 2 {
            return Err(PyTypeError::new_err(
                "__cuda_stream__ must return a tuple (version, handle)",
            ));
        }
        let version: i64 = tuple.get_item(0)?.extract()?;
        if version != 0 {
            return Err(PyNotImplementedError::new_err(format!(
                "only version 0 of the __cuda_stream__ protocol is supported, got version: '{version}'"
            )));
        }
        let handle: usize = tuple.get_item(1)?.extract()?;
        // SAFETY: the `__cuda_stream__` protocol: the object gives its live stream handle and
        // keeps the stream live while it is used (the Python object is held by the caller).
        return Ok((unsafe { RawStream::from_raw(handle) }, true));
    }
    for attr in ["ptr", "cuda_stream", "handle"] {
        if let Some(handle) = int_attr(obj, attr)? {
            // SAFETY: the handle of a CuPy, Numba or PyTorch stream object, which owns the live
            // stream while the caller holds it (RMM trusts these attributes the same way).
            return Ok((unsafe { RawStream::from_raw(handle) }, true));
        }
    }
    Err(PyTypeError::new_err(format!(
        "cannot make a Stream from an object of type {}: expected an rrmm Stream, an object \
         with __cuda_stream__, or a CuPy, Numba or PyTorch stream",
        obj.get_type().name()?
    )))
}

/// The raw stream of a `stream=` argument: `None` is a TypeError (as in RMM).
pub(crate) fn stream_arg(obj: &Bound<'_, PyAny>) -> PyResult<RawStream> {
    if let Ok(stream) = obj.cast::<PyStream>() {
        return Ok(stream.get().handle);
    }
    if obj.is_none() {
        return Err(PyTypeError::new_err(
            "stream argument cannot be None. Use DEFAULT_STREAM (or another Stream) instead.",
        ));
    }
    Ok(handle_of(obj)?.0)
}

/// `stream_arg` that also returns the argument as an rrmm `Stream` object.
pub(super) fn stream_object<'py>(
    obj: &Bound<'py, PyAny>,
) -> PyResult<(RawStream, Bound<'py, PyStream>)> {
    if let Ok(stream) = obj.cast::<PyStream>() {
        return Ok((stream.get().handle, stream.clone()));
    }
    let handle = stream_arg(obj)?;
    let wrapped = Bound::new(
        obj.py(),
        PyStream {
            handle,
            _owned: None,
            _owner: Some(obj.clone().unbind()),
        },
    )?;
    Ok((handle, wrapped))
}

// Why process-wide: RMM's `DEFAULT_STREAM` is one module-level object.
static DEFAULT: PyOnceLock<Py<PyStream>> = PyOnceLock::new();
// Why process-wide: RMM's `LEGACY_DEFAULT_STREAM` is one module-level object.
static LEGACY: PyOnceLock<Py<PyStream>> = PyOnceLock::new();
// Why process-wide: RMM's `PER_THREAD_DEFAULT_STREAM` is one module-level object.
static PER_THREAD: PyOnceLock<Py<PyStream>> = PyOnceLock::new();

fn constant<'py>(
    py: Python<'py>,
    cell: &'static PyOnceLock<Py<PyStream>>,
    handle: RawStream,
) -> PyResult<Bound<'py, PyStream>> {
    Ok(cell
        .get_or_try_init(py, || Py::new(py, PyStream::from_raw(handle)))?
        .bind(py)
        .clone())
}

/// The shared `DEFAULT_STREAM` object.
pub(super) fn default_stream(py: Python<'_>) -> PyResult<Bound<'_, PyStream>> {
    constant(py, &DEFAULT, RawStream::DEFAULT)
}

/// A Stream object for a raw handle: the shared constants for the default streams.
pub(crate) fn stream_for(py: Python<'_>, handle: RawStream) -> PyResult<Bound<'_, PyStream>> {
    Ok(match handle.raw() {
        0 => default_stream(py)?,
        1 => constant(py, &LEGACY, RawStream::LEGACY)?,
        2 => constant(py, &PER_THREAD, RawStream::PER_THREAD)?,
        _ => Bound::new(py, PyStream::from_raw(handle))?,
    })
}

#[pymethods]
impl PyStream {
    /// The garbage collector's view of the wrapped object it keeps alive.
    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        visit.call(&self._owner)
    }

    /// `Stream(obj=None, flags=None)`: a new stream (flags 0 = synchronizing with the default
    /// stream, 1 = non-blocking), or a wrapper of `obj`'s stream.
    #[new]
    #[pyo3(signature = (obj=None, flags=None))]
    fn new(py: Python<'_>, obj: Option<&Bound<'_, PyAny>>, flags: Option<i64>) -> PyResult<Self> {
        match obj {
            Some(obj) if !obj.is_none() => {
                if flags.is_some() {
                    return Err(PyValueError::new_err(
                        "flags may only be specified when obj is None",
                    ));
                }
                let (handle, keep) = handle_of(obj)?;
                Ok(PyStream {
                    handle,
                    _owned: None,
                    _owner: keep.then(|| obj.clone().unbind()),
                })
            }
            _ => {
                let non_blocking = match flags.unwrap_or(0) {
                    0 => false,
                    1 => true,
                    other => {
                        return Err(PyValueError::new_err(format!(
                            "invalid stream flags {other}: expected CudaStreamFlags.SYNC_DEFAULT \
                             (0) or CudaStreamFlags.NON_BLOCKING (1)"
                        )))
                    }
                };
                let owned = py.detach(|| {
                    let _ctx = crate::cuda::ContextGuard::new(crate::current_device_ordinal())?;
                    OwnedStream::new(non_blocking)
                });
                let owned = py_result(owned)?;
                Ok(PyStream {
                    handle: owned.stream(),
                    _owned: Some(Arc::new(owned)),
                    _owner: None,
                })
            }
        }
    }

    /// `(0, handle)`: the CUDA stream protocol, version 0.
    fn __cuda_stream__(&self) -> (i32, usize) {
        (0, self.handle.raw())
    }

    /// The raw `cudaStream_t` handle as an integer.
    #[getter]
    fn ptr(&self) -> usize {
        self.handle.raw()
    }

    /// Waits until all work on the stream has finished.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        let handle = self.handle;
        py_result(py.detach(|| {
            // A context must be current for the driver call; restore the caller's after.
            let _ctx = crate::cuda::ContextGuard::new(crate::current_device_ordinal())?;
            handle.synchronize()
        }))
    }

    /// Whether this is the (legacy) default stream, as RMM built without per-thread default.
    fn is_default(&self) -> bool {
        self.handle.is_legacy_default()
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyStream>()
            .map(|o| o.get().handle == self.handle)
            .unwrap_or(false)
    }

    fn __hash__(&self) -> u64 {
        self.handle.raw() as u64
    }

    fn __int__(&self) -> usize {
        self.handle.raw()
    }

    fn __repr__(&self) -> String {
        format!("<rrmm.Stream {:#x}>", self.handle.raw())
    }

    /// A Stream over a raw handle (internal; no ownership).
    #[staticmethod]
    fn _from_handle(py: Python<'_>, handle: usize) -> PyResult<Bound<'_, PyStream>> {
        // SAFETY: internal entry (RMM's `Stream._from_handle` contract): callers pass a live
        // stream or a default-stream handle.
        stream_for(py, unsafe { RawStream::from_raw(handle) })
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<PyStream>()?;
    m.add("DEFAULT_STREAM", default_stream(py)?)?;
    m.add("LEGACY_DEFAULT_STREAM", stream_for(py, RawStream::LEGACY)?)?;
    m.add(
        "PER_THREAD_DEFAULT_STREAM",
        stream_for(py, RawStream::PER_THREAD)?,
    )?;
    Ok(())
}

/// A `stream=` argument: left out (the default stream) or given (`None` is a TypeError).
pub(crate) enum StreamArg<'py> {
    /// Not given: `DEFAULT_STREAM`.
    Default,
    /// Given: an rrmm Stream, or another library's stream wrapped in one.
    Given(Bound<'py, PyStream>),
}

impl<'a, 'py> FromPyObject<'a, 'py> for StreamArg<'py> {
    type Error = PyErr;

    fn extract(obj: pyo3::Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let obj = obj.to_owned();
        Ok(StreamArg::Given(stream_object(&obj)?.1))
    }
}

impl<'py> StreamArg<'py> {
    /// The raw handle (no Python object is made for the default stream).
    pub(crate) fn raw(&self) -> RawStream {
        match self {
            StreamArg::Default => RawStream::DEFAULT,
            StreamArg::Given(s) => s.get().handle,
        }
    }

    /// The handle and the Stream object.
    pub(crate) fn resolve(self, py: Python<'py>) -> PyResult<(RawStream, Bound<'py, PyStream>)> {
        match self {
            StreamArg::Default => Ok((RawStream::DEFAULT, default_stream(py)?)),
            StreamArg::Given(s) => Ok((s.get().handle, s)),
        }
    }
}
