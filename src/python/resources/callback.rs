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
//! the deallocate function, while it still works, and marks the state released: the frees that
//! come later, as the pools and buffers of the cycle are torn down, find their memory given back
//! already and call nothing. RMM's contract (a resource outlives its allocations) makes this
//! safe: what was allocated through the resource was only reachable from the garbage. The one
//! holder rrmm cannot see from Python, a framework hook's allocation (CuPy, Numba, PyTorch),
//! keeps the memory: while any hook allocation from a chain that runs foreign code is live, the
//! state is only marked dead (later calls fail cleanly) and nothing is freed.

use crate::cuda::Stream as RawStream;
use crate::resource::{CallbackMemoryResource as RsCallback, MemoryKind};
use crate::Error;
use parking_lot::Mutex;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyCFunction, PySet, PyTuple, PyWeakrefReference};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Weak};

use super::resource::{sub, DeviceMemoryResource};
use crate::python::edge::stream::stream_for;
use crate::python::errors::callback_error;

/// The state's life: working, memory given back at the cycle's collection, or dead without
/// giving it back (a hook allocation may still use it).
const LIVE: u8 = 0;
const RELEASED: u8 = 1;
const DEAD: u8 = 2;

/// The user's functions, and the sentinel whose collection says theirs is due.
struct Funcs {
    allocate: Py<PyAny>,
    deallocate: Py<PyAny>,
    sentinel: Py<PyAny>,
}

impl Funcs {
    /// The allocate (`0`) or deallocate (`1`) function.
    fn pick(&self, which: usize) -> &Py<PyAny> {
        if which == 0 {
            &self.allocate
        } else {
            &self.deallocate
        }
    }
}

/// What the closures inside the Rust resource and the Python object share.
struct CallbackState {
    /// The functions, strong; traversed by the Python object.
    funcs: Mutex<Option<Funcs>>,
    /// Live allocations made through the allocate function: address -> size.
    live: Mutex<crate::live::AddressMap<usize, usize>>,
    /// [`LIVE`], [`RELEASED`] or [`DEAD`].
    phase: AtomicU8,
    /// The weak reference to the sentinel whose callback runs [`CallbackState::collected`]
    /// (held here, out of the collector's sight, so that it outlives the garbage it watches).
    watch: Mutex<Option<Py<PyWeakrefReference>>>,
}

impl CallbackState {
    /// The allocate (`0`) or deallocate (`1`) function, or an error once the state is dead.
    fn func<'py>(&self, py: Python<'py>, which: usize) -> PyResult<Bound<'py, PyAny>> {
        let funcs = self.funcs.lock();
        match (&*funcs, self.phase.load(Ordering::Acquire)) {
            (Some(f), LIVE) => Ok(f.pick(which).bind(py).clone()),
            _ => Err(pyo3::exceptions::PyRuntimeError::new_err(
                "this CallbackMemoryResource was collected with a reference cycle through its \
                 functions; it can no longer be used",
            )),
        }
    }

    /// Runs when the collector finds the state's sentinel in garbage (a cycle through the
    /// functions): gives every live allocation back through the deallocate function, which still
    /// works, then stops calling Python.
    fn collected(&self, py: Python<'_>) {
        if crate::python::hooks::shared::foreign_hook_allocations() > 0 {
            // A hook allocation may hold memory of this resource from outside the cycle.
            self.phase.store(DEAD, Ordering::Release);
            return;
        }
        let dealloc = match self.func(py, 1) {
            Ok(f) => f,
            Err(_) => return,
        };
        let live: Vec<(usize, usize)> = self.live.lock().drain().collect();
        self.phase.store(RELEASED, Ordering::Release);
        for (ptr, size) in live {
            let outcome = stream_for(py, RawStream::DEFAULT)
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

/// The callback of the sentinel's weak reference: [`CallbackState::collected`], if the state
/// still exists (it does not once the resource is gone the ordinary way).
fn watch(py: Python<'_>, state: &Arc<CallbackState>, sentinel: &Bound<'_, PyAny>) -> PyResult<()> {
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
    let watch = PyWeakrefReference::new_with(sentinel, on_collect)?;
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
        if !allocate_func.is_callable() || !deallocate_func.is_callable() {
            return Err(PyTypeError::new_err(
                "allocate_func and deallocate_func must be callable",
            ));
        }
        let sentinel = PySet::empty(py)?;
        let state = Arc::new(CallbackState {
            funcs: Mutex::new(Some(Funcs {
                allocate: allocate_func.clone().unbind(),
                deallocate: deallocate_func.clone().unbind(),
                sentinel: sentinel.clone().into_any().unbind(),
            })),
            live: Mutex::new(Default::default()),
            phase: AtomicU8::new(LIVE),
            watch: Mutex::new(None),
        });
        watch(py, &state, sentinel.as_any())?;
        let a = state.clone();
        let allocate = Box::new(
            move |bytes: usize, stream: RawStream| -> crate::Result<usize> {
                Python::attach(|py| {
                    let call = || -> PyResult<usize> {
                        let s = stream_for(py, stream)?;
                        a.func(py, 0)?.call1((bytes, s))?.extract::<usize>()
                    };
                    let ptr = call().map_err(|e| callback_error(py, e, bytes))?;
                    // Only what the resource accepts is live: a refused address given back
                    // when a cycle is collected would reach the deallocate function as a
                    // block it never handed out.
                    let ptr = crate::resource::check_returned_pointer(ptr, bytes)?;
                    if ptr != 0 {
                        a.live.lock().insert(ptr, bytes);
                    }
                    Ok(ptr)
                })
            },
        );
        let d = state.clone();
        let deallocate = Box::new(
            move |ptr: usize, bytes: usize, stream: RawStream| -> crate::Result<()> {
                if d.phase.load(Ordering::Acquire) == RELEASED {
                    // Given back when the cycle holding it was collected.
                    return Ok(());
                }
                Python::attach(|py| {
                    let call = || -> PyResult<()> {
                        let s = stream_for(py, stream)?;
                        d.func(py, 1)?.call1((ptr, bytes, s))?;
                        Ok(())
                    };
                    call().map_err(|e| callback_error(py, e, bytes))?;
                    d.live.lock().remove(&ptr);
                    Ok::<(), Error>(())
                })
            },
        );
        let mr = RsCallback::new(allocate, deallocate, MemoryKind::Device);
        Ok(sub(CallbackMemoryResource { state }, Arc::new(mr)))
    }

    /// The garbage collector's view of the functions (and the sentinel) this resource holds.
    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        // A traversal never waits: a lock held elsewhere means the functions are in use.
        if let Some(funcs) = self.state.funcs.try_lock() {
            if let Some(f) = &*funcs {
                visit.call(&f.allocate)?;
                visit.call(&f.deallocate)?;
                visit.call(&f.sentinel)?;
            }
        }
        Ok(())
    }

    /// The allocate function.
    #[getter]
    fn allocate_func(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.func(py, 0)
    }

    /// The deallocate function.
    #[getter]
    fn deallocate_func(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.func(py, 1)
    }
}

impl CallbackMemoryResource {
    fn func(&self, py: Python<'_>, which: usize) -> PyResult<Py<PyAny>> {
        let funcs = self.state.funcs.lock();
        let f = funcs.as_ref().map(|f| f.pick(which).clone_ref(py));
        f.ok_or_else(|| {
            pyo3::exceptions::PyRuntimeError::new_err(
                "this CallbackMemoryResource has no functions",
            )
        })
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<CallbackMemoryResource>()
}
