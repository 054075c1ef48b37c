//! `upstream=`: RMM's user guides (and older RMM releases) name a resource's upstream
//! `upstream`; every constructor that takes `upstream_mr` also takes it under that name.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use super::convert::upstream_arg;
use super::resource::DeviceMemoryResource;
use crate::resource::SharedResource;

/// The upstream given as `upstream_mr` (positionally or by keyword) or as `upstream`: the
/// Python object and its Rust resource.
///
/// # Errors
/// TypeError when neither or both are given, or when it is not a `DeviceMemoryResource`.
pub(super) fn upstream_of(
    upstream_mr: Option<&Bound<'_, PyAny>>,
    upstream: Option<&Bound<'_, PyAny>>,
) -> PyResult<(Py<DeviceMemoryResource>, SharedResource)> {
    let given = match (upstream_mr, upstream) {
        (Some(mr), None) | (None, Some(mr)) => mr,
        (Some(_), Some(_)) => {
            return Err(PyTypeError::new_err(
                "got both `upstream_mr` and `upstream` (they name the same argument)",
            ))
        }
        (None, None) => {
            return Err(PyTypeError::new_err(
                "missing required argument 'upstream_mr' (or 'upstream')",
            ))
        }
    };
    upstream_arg(given)
}

/// A required argument that follows `upstream_mr` (optional in the signature so that
/// `upstream=` can be given by keyword instead).
///
/// # Errors
/// TypeError naming `name` when it is missing.
pub(super) fn required<T>(value: Option<T>, name: &str) -> PyResult<T> {
    value.ok_or_else(|| PyTypeError::new_err(format!("missing required argument '{name}'")))
}
