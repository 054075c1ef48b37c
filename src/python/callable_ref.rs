//! How a Rust closure inside a resource holds the user's Python function: weakly where it can.
//!
//! The resource's Python object holds the function strongly (its `allocate_func` and so on) and
//! shows it to the garbage collector (`__traverse__`). If the closure held it strongly too, a
//! reference cycle through the function (a callback that refers to the pool above it) could be
//! collected while the closure still held it: the collector clears the function's globals and
//! closure (`tp_clear`) and a later call through the closure crashes the interpreter. The
//! collector clears weak references to garbage before it clears anything, so a closure that
//! holds a weak reference finds it dead and fails cleanly instead. Callables that cannot be
//! weakly referenced are held strongly (such a cycle is then never collected, which is safe).

use pyo3::prelude::*;
use pyo3::types::{PyWeakrefMethods, PyWeakrefReference};

/// The user's callable as a closure holds it. (A strong reference here is never shown to the
/// garbage collector: it is not the Python object's own, so it only keeps a cycle alive.)
pub(crate) enum CallableRef {
    /// A weak reference (the usual case).
    Weak(Py<PyWeakrefReference>),
    /// A strong reference, for callables without weak reference support.
    Strong(Py<PyAny>),
}

impl CallableRef {
    /// A reference to `f` for a closure.
    pub(crate) fn new(f: &Bound<'_, PyAny>) -> Self {
        match PyWeakrefReference::new(f) {
            Ok(weak) => CallableRef::Weak(weak.unbind()),
            Err(_) => CallableRef::Strong(f.clone().unbind()),
        }
    }

    /// The callable, or a RuntimeError when it is gone (collected with the resource).
    pub(crate) fn get<'py>(&self, py: Python<'py>, what: &str) -> PyResult<Bound<'py, PyAny>> {
        match self {
            CallableRef::Weak(weak) => weak.bind(py).upgrade().ok_or_else(|| {
                pyo3::exceptions::PyRuntimeError::new_err(format!(
                    "the {what} of this resource is gone (collected with it)"
                ))
            }),
            CallableRef::Strong(f) => Ok(f.bind(py).clone()),
        }
    }
}
