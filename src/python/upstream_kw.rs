//! `upstream=`: RMM's user guides (and older RMM releases) name a resource's upstream
//! `upstream`; every constructor that takes `upstream_mr` also takes it under that name.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

/// The upstream given as `upstream_mr` (positionally or by keyword) or as `upstream`.
///
/// # Errors
/// TypeError when neither or both are given.
pub(crate) fn pick_upstream<'a, 'py>(
    upstream_mr: Option<&'a Bound<'py, PyAny>>,
    upstream: Option<&'a Bound<'py, PyAny>>,
) -> PyResult<&'a Bound<'py, PyAny>> {
    match (upstream_mr, upstream) {
        (Some(mr), None) | (None, Some(mr)) => Ok(mr),
        (Some(_), Some(_)) => Err(PyTypeError::new_err(
            "got both `upstream_mr` and `upstream` (they name the same argument)",
        )),
        (None, None) => Err(PyTypeError::new_err(
            "missing required argument 'upstream_mr' (or 'upstream')",
        )),
    }
}

/// A required argument that follows `upstream_mr` (optional in the signature so that
/// `upstream=` can be given by keyword instead).
///
/// # Errors
/// TypeError naming `name` when it is missing.
pub(crate) fn required<'a, 'py>(
    value: Option<&'a Bound<'py, PyAny>>,
    name: &str,
) -> PyResult<&'a Bound<'py, PyAny>> {
    value.ok_or_else(|| PyTypeError::new_err(format!("missing required argument '{name}'")))
}
