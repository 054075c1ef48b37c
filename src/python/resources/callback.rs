//! `rrmm.mr.CallbackMemoryResource`: allocation through the user's Python functions, and what
//! happens to its memory when a reference cycle through those functions is collected.
//!
//! The functions are held strongly, in one place ([`CallbackState`]), which the resource's
//! Python object shows to the garbage collector (`__traverse__`): a cycle through them (a
//! callback that refers to the pool above it, or to a buffer of its own) is collectable. When
//! the collector finds such a cycle, every object in it is intact until it starts clearing them
//! (`tp_clear`, which leaves a Python function unusable); a weak reference to a sentinel only the
//! state holds tells rrmm first (weak references to garbage are cleared, and their callbacks
//! run, before anything is cleared). rrmm then gives every allocation still live back through
//! the deallocate function, while it still works, and retires the functions: the frees that
//! come later, as the pools and buffers of the cycle are torn down, find their memory given back
//! already and call nothing. RMM's contract (a resource outlives its allocations) makes this
//! safe: what was allocated through the resource was only reachable from the garbage. The one
//! holder rrmm cannot see from Python, a framework hook's allocation (CuPy, Numba, PyTorch),
//! keeps the memory: while any hook allocation from a chain that runs foreign code is live, the
//! state is only marked dead (later calls fail cleanly) and nothing is freed.

use crate::cuda::Stream as RawStream;
use crate::python::python_functions::{all_callable, PythonFunctions, Raised, StreamArg, Which};
use crate::resource::{CallbackMemoryResource as RsCallback, MemoryKind};
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyCFunction, PySet, PyTuple, PyWeakrefReference};
use std::sync::{Arc, Weak};

use super::resource::{sub, DeviceMemoryResource};

/// What the Python object and the watch of its cycle share.
struct CallbackState {
    /// The user's functions (the one Rust resource over Python functions calls them).
    functions: Arc<PythonFunctions>,
    /// The resource over them, which records every live block.
    resource: Arc<RsCallback>,
    /// An object only this state holds; its collection says a cycle through the functions is
    /// being collected. Traversed by the Python object.
    sentinel: Py<PyAny>,
    /// The weak reference to the sentinel whose callback runs [`CallbackState::collected`]
    /// (held here, out of the collector's sight, so that it outlives the garbage it watches).
    watch: Mutex<Option<Py<PyWeakrefReference>>>,
}

impl CallbackState {
    /// Runs when the collector finds the state's sentinel in garbage (a cycle through the
    /// functions): gives every live allocation back through the deallocate function, which still
    /// works, then stops calling Python (later frees of those blocks call nothing).
    fn collected(&self, py: Python<'_>) {
        if crate::python::hooks::shared::foreign_hook_allocations() > 0 {
            // A hook allocation may hold memory of this resource from outside the cycle.
            self.functions.retire();
            return;
        }
        let Ok(dealloc) = self.functions.func(py, Which::Deallocate) else {
            return;
        };
        let live = self.resource.release_live();
        self.functions.retire();
        for (ptr, size) in live {
            let outcome = self
                .functions
                .stream_arg(py, RawStream::DEFAULT)
                .and_then(|s| dealloc.call1((ptr, size, s)).map(drop));
            if let Err(e) = outcome {
                // "Exception ignored in: <the deallocate function>", as CPython names the
                // function whose exception it could not raise.
                e.write_unraisable(py, Some(dealloc.as_any()));
            }
        }
    }
}

/// Allocation through Python functions: `allocate_func(size, stream) -> int` and
/// `deallocate_func(ptr, size, stream)`. Exceptions they raise propagate to the caller.
#[pyclass(module = "rrmm.mr", name = "CallbackMemoryResource", extends = DeviceMemoryResource, frozen)]
pub(super) struct CallbackMemoryResource {
    state: Arc<CallbackState>,
}

/// Watches `state`'s sentinel: the callback of its weak reference runs
/// [`CallbackState::collected`], if the state still exists (it does not once the resource is
/// gone the ordinary way).
fn watch(py: Python<'_>, state: &Arc<CallbackState>) -> PyResult<()> {
    let weak: Weak<CallbackState> = Arc::downgrade(state);
    let on_collect = PyCFunction::new_closure(
        py,
        None,
        None,
        move |args: &Bound<'_, PyTuple>, _kwargs| -> PyResult<()> {
            if let Some(state) = weak.upgrade() {
                state.collected(args.py());
            }
            Ok(())
        },
    )?;
    let watch = PyWeakrefReference::new_with(state.sentinel.bind(py), on_collect)?;
    *state.watch.lock() = Some(watch.unbind());
    Ok(())
}

#[pymethods]
impl CallbackMemoryResource {
    #[new]
    fn new(
        py: Python<'_>,
        allocate_func: &Bound<'_, PyAny>,
        deallocate_func: &Bound<'_, PyAny>,
    ) -> PyResult<PyClassInitializer<Self>> {
        all_callable(
            &[Some(allocate_func), Some(deallocate_func)],
            "allocate_func and deallocate_func must be callable",
        )?;
        let functions = Arc::new(PythonFunctions::new(
            allocate_func,
            deallocate_func,
            StreamArg::Object,
            Raised::AsRmm,
        ));
        let resource = Arc::new(functions.resource(MemoryKind::Device, None));
        let state = Arc::new(CallbackState {
            functions,
            resource: resource.clone(),
            sentinel: PySet::empty(py)?.into_any().unbind(),
            watch: Mutex::new(None),
        });
        watch(py, &state)?;
        Ok(sub(CallbackMemoryResource { state }, resource))
    }

    /// The garbage collector's view of the functions (and the sentinel) this resource holds.
    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        self.state.functions.traverse(&visit)?;
        visit.call(&self.state.sentinel)
    }

    /// The allocate function.
    #[getter]
    fn allocate_func<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.state.functions.func(py, Which::Allocate)
    }

    /// The deallocate function.
    #[getter]
    fn deallocate_func<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.state.functions.func(py, Which::Deallocate)
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<CallbackMemoryResource>()
}
