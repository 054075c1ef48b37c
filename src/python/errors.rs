//! rrmm's errors as the Python exceptions RMM raises.

use crate::Error;
use pyo3::exceptions::{PyIndexError, PyMemoryError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// Converts an rrmm error into the exception RMM raises for it: out of memory is a
/// `MemoryError`, bad arguments a `ValueError`, a missing level an `IndexError`, CUDA and logic
/// errors a `RuntimeError`, file errors an `OSError`; a Python callback's failure re-raises the
/// exception it carries.
pub(crate) fn to_pyerr(error: Error) -> PyErr {
    let text = error.to_string();
    match error {
        Error::OutOfMemory { .. } => PyMemoryError::new_err(text),
        Error::InvalidArgument { .. } => PyValueError::new_err(text),
        Error::OutOfRange(_) => PyIndexError::new_err(text),
        Error::Io { .. } => PyOSError::new_err(text),
        Error::Cuda { .. } | Error::NoDriver(_) | Error::Logic(_) | Error::NoPeerAccess { .. } => {
            PyRuntimeError::new_err(text)
        }
        // The exception a Python callback raised (as RMM raises it), carried in the error.
        Error::Callback {
            payload,
            out_of_memory,
            ..
        } => match payload.downcast_ref::<PyErr>() {
            Some(err) => Python::attach(|py| err.clone_ref(py)),
            None if out_of_memory => PyMemoryError::new_err(text),
            None => PyRuntimeError::new_err(text),
        },
    }
}

/// `?`-friendly conversion: `result.map_err(to_pyerr)?` spelled `py_result(result)?`.
pub(crate) fn py_result<T>(result: crate::Result<T>) -> PyResult<T> {
    result.map_err(to_pyerr)
}

/// Turns an exception raised by a Python callback (inside a resource or a failure callback)
/// into an [`Error::Callback`] that carries it (as RMM raises it, see `as_rmm_raises`), so that
/// `to_pyerr` re-raises that very exception when the error comes back to Python, whatever
/// thread or path it took. A `MemoryError` counts as out of memory (pools and failure callbacks
/// react to it).
pub(crate) fn callback_error(py: Python<'_>, err: PyErr, requested: usize) -> Error {
    let err = as_rmm_raises(py, err);
    let out_of_memory = err.is_instance_of::<PyMemoryError>(py);
    carried_error(err, out_of_memory, requested)
}

/// An [`Error::Callback`] carrying the exception `err` a Python function raised for an
/// allocation of `requested` bytes, out of memory or not as the caller decided.
pub(crate) fn carried_error(err: PyErr, out_of_memory: bool, requested: usize) -> Error {
    let message = if out_of_memory {
        format!(
            "std::bad_alloc: out_of_memory: Python callback: {err} (failed to allocate \
             {requested} bytes)"
        )
    } else {
        format!("Python callback raised {err}")
    };
    Error::callback(message, out_of_memory, err)
}

/// What RMM raises for an exception from a Python callback: a `MemoryError` or `RuntimeError`
/// (or a subclass) as it is; any other `Exception` as a `RuntimeError` with the same message,
/// the original as its cause (a bare `BaseException` too, as RMM does). The exceptions that stop
/// a program (`KeyboardInterrupt`, `SystemExit`, `GeneratorExit`) stay as they are: a Ctrl-C in
/// a callback stays a Ctrl-C.
fn as_rmm_raises(py: Python<'_>, err: PyErr) -> PyErr {
    use pyo3::exceptions::{PyGeneratorExit, PyKeyboardInterrupt, PySystemExit};
    if err.is_instance_of::<PyMemoryError>(py)
        || err.is_instance_of::<PyRuntimeError>(py)
        || err.is_instance_of::<PyKeyboardInterrupt>(py)
        || err.is_instance_of::<PySystemExit>(py)
        || err.is_instance_of::<PyGeneratorExit>(py)
    {
        return err;
    }
    let message = err
        .value(py)
        .str()
        .map(|s| s.to_string())
        .unwrap_or_default();
    let converted = PyRuntimeError::new_err(message);
    converted.set_cause(py, Some(err));
    converted
}

/// An error when the calling thread is inside one of `mr`'s own upstream calls (a callback
/// calling back into the resource that called it), where its figures cannot be read.
pub(crate) fn figures_readable(mr: &dyn crate::MemoryResource) -> PyResult<()> {
    if mr.report().is_some_and(|r| r.busy()) {
        return Err(PyRuntimeError::new_err(format!(
            "{}: its figures cannot be read from inside its own upstream call (a callback of the \
             resource it serves)",
            mr.name()
        )));
    }
    Ok(())
}

pub(crate) fn register(_m: &Bound<'_, PyModule>) -> PyResult<()> {
    Ok(())
}

/// Writes one line to the process's standard error, losing it if the write fails (a closed
/// or broken stderr): for the places that cannot raise, the `extern "C"` entry points and
/// destructors. `eprintln!` panics when the write fails, and a panic there aborts the process.
pub(crate) fn report_to_stderr(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{args}");
}
