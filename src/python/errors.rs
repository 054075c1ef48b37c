//! rrmm's errors as the Python exceptions RMM raises.

use crate::Error;
use pyo3::exceptions::{PyIndexError, PyMemoryError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// Converts an rrmm error into the exception RMM raises for it: out of memory is a
/// `MemoryError`, bad arguments a `ValueError`, a missing level an `IndexError`, CUDA and logic
/// errors a `RuntimeError`, file errors an `OSError`.
pub(crate) fn to_pyerr(error: Error) -> PyErr {
    let text = error.to_string();
    if let Some(original) = take_stashed(&text, error.is_out_of_memory()) {
        return original;
    }
    match error {
        Error::OutOfMemory { .. } => PyMemoryError::new_err(text),
        Error::InvalidArgument { .. } => PyValueError::new_err(text),
        Error::OutOfRange(_) => PyIndexError::new_err(text),
        Error::Io { .. } => PyOSError::new_err(text),
        Error::Cuda { .. } | Error::NoDriver(_) | Error::Logic(_) => PyRuntimeError::new_err(text),
    }
}

/// `?`-friendly conversion: `result.map_err(to_pyerr)?` spelled `py_result(result)?`.
pub(crate) fn py_result<T>(result: crate::Result<T>) -> PyResult<T> {
    result.map_err(to_pyerr)
}

thread_local! {
    /// The last Python exception raised inside a Python callback, with the text of the rrmm
    /// error that carried it out of Rust.
    static STASHED: std::cell::RefCell<Option<(Option<String>, PyErr)>> =
        const { std::cell::RefCell::new(None) };
}

/// Turns an exception raised by a Python callback (inside a resource) into an rrmm error, and
/// remembers the exception so that `to_pyerr` re-raises it unchanged when that error comes back
/// to Python on this thread. A `MemoryError` becomes an out-of-memory error.
pub(crate) fn stash_pyerr(py: Python<'_>, err: PyErr, requested: usize) -> Error {
    let err = as_rmm_raises(py, err);
    let error = if err.is_instance_of::<PyMemoryError>(py) {
        Error::out_of_memory(requested, format!("Python callback: {err}"))
    } else {
        Error::Logic(format!("Python callback raised {err}"))
    };
    let text = error.to_string();
    STASHED.with(|cell| *cell.borrow_mut() = Some((Some(text), err)));
    error
}

/// Remembers an exception raised by a Python callback whose failure reaches Rust only as a
/// refusal (the failure callback's `false`): the next out-of-memory error converted on this
/// thread becomes this exception.
pub(crate) fn stash_pyerr_any(err: PyErr) {
    let err = Python::attach(|py| as_rmm_raises(py, err));
    STASHED.with(|cell| *cell.borrow_mut() = Some((None, err)));
}

/// What RMM raises for an exception from a Python callback: a `MemoryError` or `RuntimeError`
/// (or a subclass) as it is; anything else (`Exception`, `BaseException`, ...) as a
/// `RuntimeError` with the same message, the original as its cause.
fn as_rmm_raises(py: Python<'_>, err: PyErr) -> PyErr {
    if err.is_instance_of::<PyMemoryError>(py) || err.is_instance_of::<PyRuntimeError>(py) {
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

fn take_stashed(text: &str, out_of_memory: bool) -> Option<PyErr> {
    STASHED
        .try_with(|cell| {
            let mut slot = cell.borrow_mut();
            match slot.as_ref() {
                Some((None, _)) if out_of_memory => slot.take().map(|(_, err)| err),
                Some((Some(stashed), _)) if stashed == text => slot.take().map(|(_, err)| err),
                _ => None,
            }
        })
        .ok()
        .flatten()
}

pub(crate) fn register(_m: &Bound<'_, PyModule>) -> PyResult<()> {
    Ok(())
}
