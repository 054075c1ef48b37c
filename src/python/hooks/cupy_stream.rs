//! CuPy's current stream, found the way CuPy's own memory pool finds it: by calling CuPy's C
//! function `get_current_stream_ptr()` directly, with no Python call.
//!
//! CuPy is written in Cython, and Cython publishes the C functions a module declares in its
//! `.pxd` file in the module's `__pyx_capi__` dict, each as a capsule named by its C signature.
//! `cupy_backends.cuda.stream` publishes `intptr_t get_current_stream_ptr()`, the thread's
//! current stream of the current device (the per-thread default stream under
//! `CUPY_CUDA_PER_THREAD_DEFAULT_STREAM`), which is what `cupy.cuda.get_current_stream().ptr`
//! returns through two Python calls and an attribute lookup. Both CuPy hooks (the C-function
//! allocator and the RMM-style unowned one) use it. When the capsule is missing or
//! its signature is not the expected one (another CuPy release), the lookup falls back to that
//! Python path, so a CuPy change costs speed, never correctness.

use parking_lot::Mutex;
use pyo3::exceptions::PyImportError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyCapsule, PyCapsuleMethods};
use std::ffi::c_void;

/// The C signature `get_current_stream_ptr` must have: no argument, an `intptr_t` back.
/// Cython may append an exception specification; any error it sets is checked after the call.
const EXPECTED_SIGNATURE: &str = "intptr_t(void)";

/// A C function with no argument returning a stream handle (`intptr_t f(void)`).
type StreamGetter = unsafe extern "C" fn() -> isize;

/// How the CuPy hook asks CuPy for its current stream.
pub(super) enum CupyStreamLookup {
    /// CuPy's C function, called directly.
    CFunction(StreamGetter),
    /// `cupy.cuda.stream.get_current_stream` (its `.ptr`), for CuPy releases without the C
    /// function.
    Python(Py<PyAny>),
}

impl CupyStreamLookup {
    /// The lookup for this process's CuPy, found on first use.
    ///
    /// # Errors
    /// An ImportError naming CuPy when CuPy cannot be imported.
    pub(crate) fn get(py: Python<'_>) -> PyResult<&'static CupyStreamLookup> {
        // Why process-wide: CuPy's C function for its current stream, found once.
        static LOOKUP: PyOnceLock<CupyStreamLookup> = PyOnceLock::new();
        LOOKUP.get_or_try_init(py, || find(py))
    }

    /// CuPy's current stream, as a raw handle.
    ///
    /// # Errors
    /// What CuPy raises (it can only fail if its thread-local state cannot be made).
    pub(crate) fn current_stream(&self, py: Python<'_>) -> PyResult<usize> {
        match self {
            Self::CFunction(getter) => call_getter(py, *getter),
            Self::Python(get_current_stream) => {
                let ptr: isize = get_current_stream
                    .bind(py)
                    .call0()?
                    .getattr(pyo3::intern!(py, "ptr"))?
                    .extract()?;
                Ok(ptr as usize)
            }
        }
    }

    /// `"c"` or `"python"`: which lookup is in use (shown by tests and benchmarks).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::CFunction(_) => "c",
            Self::Python(_) => "python",
        }
    }
}

/// The stream a CuPy-hook allocation was made on, as CuPy lets it be used: a stream may be
/// destroyed before the memory allocated on it is freed (CuPy's own `MemoryAsync` then frees on
/// the current stream, trusting the user to have ordered the work). A free on a destroyed
/// stream's handle would be undefined behaviour in the driver (a crash with `cuda_async`), so an
/// allocation on a stream CuPy created keeps a weak reference to CuPy's stream object and, once
/// that is dead, frees on CuPy's current stream instead. Default streams (the null, legacy and
/// per-thread handles) live for ever and carry no reference.
pub(super) struct AllocationStream {
    raw: usize,
    /// `weakref.ref(stream)` for a stream CuPy created; `None` for a default stream.
    alive: Option<Py<PyAny>>,
}

/// Stream handles that are never destroyed: CUDA's null, legacy and per-thread default streams.
fn is_default_stream(raw: usize) -> bool {
    raw <= 2
}

/// Weak references to CuPy's stream objects by handle (one Python call per stream, not per
/// allocation). An entry whose stream is dead is replaced when its handle is seen again (CUDA
/// reuses the handles of destroyed streams).
// Why process-wide: CuPy's streams are the process's; one weak reference per handle.
static STREAM_REFS: Mutex<Vec<(usize, Py<PyAny>)>> = Mutex::new(Vec::new());

/// A live weak reference to the CuPy stream object of handle `raw` (CuPy's current stream).
fn stream_weakref(py: Python<'_>, raw: usize) -> PyResult<Py<PyAny>> {
    {
        let refs = STREAM_REFS.lock();
        if let Some((_, weak)) = refs.iter().find(|(h, _)| *h == raw) {
            if !weak.bind(py).call0()?.is_none() {
                return Ok(weak.clone_ref(py));
            }
        }
    }
    let stream = py.import("cupy.cuda")?.call_method0("get_current_stream")?;
    let weak = py
        .import("weakref")?
        .call_method1("ref", (stream,))?
        .unbind();
    let mut refs = STREAM_REFS.lock();
    refs.retain(|(h, w)| *h != raw && w.bind(py).call0().is_ok_and(|s| !s.is_none()));
    refs.push((raw, weak.clone_ref(py)));
    Ok(weak)
}

impl AllocationStream {
    /// CuPy's current stream, for an allocation about to be made on it.
    ///
    /// # Errors
    /// What CuPy raises.
    pub(crate) fn current(py: Python<'_>) -> PyResult<Self> {
        let raw = CupyStreamLookup::get(py)?.current_stream(py)?;
        let alive = if is_default_stream(raw) {
            None
        } else {
            Some(stream_weakref(py, raw)?)
        };
        Ok(AllocationStream { raw, alive })
    }

    /// The handle the allocation was made on.
    pub(crate) fn raw(&self) -> usize {
        self.raw
    }

    /// The handle to free on, asking Python only for a stream CuPy created: a default stream's
    /// allocation frees without touching the GIL (CuPy may free without holding it).
    pub(crate) fn free_handle(&self) -> usize {
        if self.alive.is_none() {
            return self.raw;
        }
        Python::attach(|py| self.for_free(py))
    }

    /// The handle to free on: the allocation's stream while CuPy's object for it lives, else
    /// CuPy's current stream (the default stream if even that cannot be asked).
    fn for_free(&self, py: Python<'_>) -> usize {
        let Some(weak) = &self.alive else {
            return self.raw;
        };
        if weak.bind(py).call0().is_ok_and(|s| !s.is_none()) {
            return self.raw;
        }
        CupyStreamLookup::get(py)
            .and_then(|lookup| lookup.current_stream(py))
            .unwrap_or(0)
    }
}

/// Calls a stream getter with the GIL held, turning a Python error it sets into `Err`.
fn call_getter(py: Python<'_>, getter: StreamGetter) -> PyResult<usize> {
    // SAFETY: `getter` came from a capsule whose name is the C signature `intptr_t (void)`
    // (checked in `getter_from_capsule`), so calling it with no argument is its contract; it is
    // Cython code that needs the GIL, which `py` proves is held.
    let ptr = unsafe { getter() };
    match PyErr::take(py) {
        Some(error) => Err(error),
        None => Ok(ptr as usize),
    }
}

/// The C function in `capsule` when its name (Cython's signature string) says it is
/// `intptr_t f(void)`, else `None`.
pub(super) fn getter_from_capsule(capsule: &Bound<'_, PyAny>) -> Option<StreamGetter> {
    let capsule = capsule.cast::<PyCapsule>().ok()?;
    let name = capsule.name().ok()??;
    // SAFETY: the name is used at once, while the capsule (held by `capsule`) is alive and no
    // Python code runs; Cython's signature names are static strings.
    let name = unsafe { name.as_cstr() };
    let compact: String = name
        .to_str()
        .ok()?
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    if !compact.starts_with(EXPECTED_SIGNATURE) {
        return None;
    }
    // The name passed is the capsule's own, so this only fails for a null pointer.
    let pointer = capsule.pointer_checked(Some(name)).ok()?;
    // SAFETY: Cython stores C function pointers in these capsules, and the signature checked
    // above is the one `StreamGetter` spells; function and data pointers have one size here.
    Some(unsafe { std::mem::transmute::<*mut c_void, StreamGetter>(pointer.as_ptr()) })
}

/// Finds CuPy's C function, or falls back to its Python function.
fn find(py: Python<'_>) -> PyResult<CupyStreamLookup> {
    let c_function = py
        .import("cupy_backends.cuda.stream")
        .and_then(|module| module.getattr("__pyx_capi__"))
        .and_then(|capi| capi.get_item("get_current_stream_ptr"))
        .ok()
        .and_then(|capsule| getter_from_capsule(&capsule));
    if let Some(getter) = c_function {
        return Ok(CupyStreamLookup::CFunction(getter));
    }
    let stream = py
        .import("cupy.cuda.stream")
        .map_err(|cause| cupy_missing(py, cause))?;
    Ok(CupyStreamLookup::Python(
        stream.getattr("get_current_stream")?.unbind(),
    ))
}

/// The ImportError that says CuPy is missing, `cause` attached and `name` set to `"cupy"` (as
/// Python's own ImportError sets it).
pub(super) fn cupy_missing(py: Python<'_>, cause: PyErr) -> PyErr {
    let error = PyImportError::new_err(format!(
        "rrmm.allocators.cupy needs cupy, which could not be imported ({cause}); install it with \
         `pip install cupy-cuda12x` (or cupy-cuda13x)"
    ));
    error.set_cause(py, Some(cause));
    let _ = error.value(py).setattr("name", "cupy");
    error
}

/// `cupy_stream_lookup() -> "c" | "python"`: how the CuPy hook finds CuPy's current stream
/// (imports CuPy).
#[pyfunction]
fn cupy_stream_lookup(py: Python<'_>) -> PyResult<&'static str> {
    Ok(CupyStreamLookup::get(py)?.kind())
}

/// `call_stream_capsule(capsule) -> int | None`: calls the C function in `capsule` the way the
/// CuPy hook calls CuPy's, or gives None when its signature is not `intptr_t (void)` (for tests).
#[pyfunction]
fn call_stream_capsule(py: Python<'_>, capsule: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
    getter_from_capsule(capsule)
        .map(|getter| call_getter(py, getter))
        .transpose()
}

crate::python::register_items! {
    functions: cupy_stream_lookup, call_stream_capsule;
}
