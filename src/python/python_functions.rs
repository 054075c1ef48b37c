//! The one Rust resource over Python functions: `rrmm.mr.CallbackMemoryResource` and
//! `replay_allocator` (the replay of allocators written in Python) both make theirs here, a
//! [`CallbackMemoryResource`](crate::resource::CallbackMemoryResource) whose closures call the
//! functions with the GIL taken for the call only. What differs between the two is an option
//! of it: what the functions get as their stream, and how what they raise becomes the error.
//! The resource itself checks every block the functions return (alignment, overlap with a live
//! block) and every free.

use crate::cuda::Stream;
use crate::python::edge::stream::stream_for;
use crate::python::errors::{callback_error, carried_error};
use crate::resource::{CallbackMemoryResource, MemoryKind};
use crate::Error;
use parking_lot::Mutex;
use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What the functions get as their `stream` argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StreamArg {
    /// rrmm's `Stream` object (RMM's contract for `CallbackMemoryResource`).
    Object,
    /// The raw handle, an int (the replay engine's streams: 0, 1, 2 for the default streams).
    Handle,
}

/// How an exception the functions raise becomes the allocation's error (out of memory or not;
/// the exception itself is carried, so the caller raises it).
pub(crate) enum Raised {
    /// As RMM raises it: `MemoryError` (out of memory) and `RuntimeError` as they are, any other
    /// `Exception` as a `RuntimeError` with the original as its cause, and what is not an
    /// `Exception` (`KeyboardInterrupt`, `SystemExit`) as it is.
    AsRmm,
    /// As it is; out of memory for `MemoryError` and for the exception types given (PyTorch's
    /// is a `RuntimeError`).
    AsIs { out_of_memory: Option<Py<PyAny>> },
}

/// Which of the two functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Which {
    /// `allocate(size, stream) -> int`.
    Allocate,
    /// `deallocate(ptr, size, stream)`.
    Deallocate,
}

/// Whether every function given is callable: a TypeError saying `message` otherwise.
pub(crate) fn all_callable(
    functions: &[Option<&Bound<'_, PyAny>>],
    message: &'static str,
) -> PyResult<()> {
    if functions.iter().flatten().any(|f| !f.is_callable()) {
        return Err(PyTypeError::new_err(message));
    }
    Ok(())
}

/// The user's allocate and deallocate functions, held strongly until [`retire`](Self::retire).
pub(crate) struct PythonFunctions {
    funcs: Mutex<Option<[Py<PyAny>; 2]>>,
    retired: AtomicBool,
    stream: StreamArg,
    raised: Raised,
}

impl PythonFunctions {
    /// The functions `allocate` and `deallocate` (the caller has checked they are callable:
    /// [`all_callable`]).
    pub(crate) fn new(
        allocate: &Bound<'_, PyAny>,
        deallocate: &Bound<'_, PyAny>,
        stream: StreamArg,
        raised: Raised,
    ) -> Self {
        PythonFunctions {
            funcs: Mutex::new(Some([
                allocate.clone().unbind(),
                deallocate.clone().unbind(),
            ])),
            retired: AtomicBool::new(false),
            stream,
            raised,
        }
    }

    /// The function, or a RuntimeError once retired.
    pub(crate) fn func<'py>(&self, py: Python<'py>, which: Which) -> PyResult<Bound<'py, PyAny>> {
        let funcs = self.funcs.lock();
        match (&*funcs, self.retired.load(Ordering::Acquire)) {
            (Some(f), false) => Ok(f[which as usize].bind(py).clone()),
            _ => Err(PyRuntimeError::new_err(
                "this resource's functions were collected with a reference cycle through them; \
                 it can no longer be used",
            )),
        }
    }

    /// Stops calling the functions: later allocations and frees that reach them fail cleanly.
    pub(crate) fn retire(&self) {
        self.retired.store(true, Ordering::Release);
    }

    /// Shows the garbage collector the functions (never waits: a lock held elsewhere means they
    /// are in use).
    pub(crate) fn traverse(&self, visit: &pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        if let Some(funcs) = self.funcs.try_lock() {
            for f in funcs.iter().flatten() {
                visit.call(f)?;
            }
        }
        Ok(())
    }

    /// The `stream` argument for `stream`.
    pub(crate) fn stream_arg<'py>(
        &self,
        py: Python<'py>,
        stream: Stream,
    ) -> PyResult<Bound<'py, PyAny>> {
        match self.stream {
            StreamArg::Object => Ok(stream_for(py, stream)?.into_any()),
            StreamArg::Handle => Ok(stream.raw().into_pyobject(py)?.into_any()),
        }
    }

    /// The error of the exception `err` raised for `bytes`.
    fn error(&self, py: Python<'_>, err: PyErr, bytes: usize) -> Error {
        match &self.raised {
            Raised::AsRmm => callback_error(py, err, bytes),
            Raised::AsIs { out_of_memory } => {
                let oom = err.is_instance_of::<PyMemoryError>(py)
                    || out_of_memory
                        .as_ref()
                        .is_some_and(|types| err.is_instance(py, types.bind(py)));
                carried_error(err, oom, bytes)
            }
        }
    }

    fn allocate(&self, bytes: usize, stream: Stream) -> crate::Result<usize> {
        Python::attach(|py| {
            let call = || -> PyResult<usize> {
                let s = self.stream_arg(py, stream)?;
                self.func(py, Which::Allocate)?
                    .call1((bytes, s))?
                    .extract::<usize>()
            };
            call().map_err(|e| self.error(py, e, bytes))
        })
    }

    fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> crate::Result<()> {
        Python::attach(|py| {
            let call = || -> PyResult<()> {
                let s = self.stream_arg(py, stream)?;
                self.func(py, Which::Deallocate)?.call1((ptr, bytes, s))?;
                Ok(())
            };
            call().map_err(|e| self.error(py, e, bytes))
        })
    }

    /// The resource over these functions, handing out memory of `kind` (on `device` where
    /// given).
    pub(crate) fn resource(
        self: &Arc<Self>,
        kind: MemoryKind,
        device: Option<usize>,
    ) -> CallbackMemoryResource {
        let a = self.clone();
        let d = self.clone();
        let mr = CallbackMemoryResource::new(
            Box::new(move |bytes, stream| a.allocate(bytes, stream)),
            Box::new(move |ptr, bytes, stream| d.deallocate(ptr, bytes, stream)),
            kind,
        );
        match device {
            Some(device) => mr.on_device(device),
            None => mr,
        }
    }
}
