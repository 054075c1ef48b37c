//! rrmm's errors as the Python exceptions RMM raises.

use crate::Error;
use pyo3::exceptions::{PyIndexError, PyMemoryError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// Converts an rrmm error into the exception RMM raises for it: out of memory is a
/// `MemoryError`, bad arguments a `ValueError`, a missing level an `IndexError`, CUDA and logic
/// errors a `RuntimeError`, file errors an `OSError`.
pub(crate) fn to_pyerr(error: Error) -> PyErr {
    let text = error.to_string();
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

pub(crate) fn register(_m: &Bound<'_, PyModule>) -> PyResult<()> {
    Ok(())
}
