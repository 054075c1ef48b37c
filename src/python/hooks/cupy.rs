//! The CuPy hooks (`rrmm.allocators.cupy`): the C-function allocator CuPy calls with no Python
//! object of rrmm's per allocation (a live map remembers what to free), the RMM-style unowned
//! allocator that returns a `MemoryPointer` in one call, and pinned host memory.

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use std::ffi::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use super::cupy_stream::{cupy_missing, AllocationStream};
use super::shared::{allocate_on, deallocate_on, Context, HookAllocation, HookResource};
use crate::python::errors::{py_result, report_to_stderr};
use crate::{Error, MemoryResource, Stream};

/// CuPy's callables the CuPy hook needs, looked up once.
struct CupyBindings {
    unowned_memory: Py<PyAny>,
    memory_pointer: Py<PyAny>,
}

fn cupy_bindings(py: Python<'_>) -> PyResult<&'static CupyBindings> {
    // Why process-wide: CuPy's classes, imported once.
    static CUPY: PyOnceLock<CupyBindings> = PyOnceLock::new();
    CUPY.get_or_try_init(py, || {
        let missing = |cause| cupy_missing(py, cause);
        let memory = py.import("cupy.cuda.memory").map_err(missing)?;
        Ok(CupyBindings {
            unowned_memory: memory.getattr("UnownedMemory")?.unbind(),
            memory_pointer: memory.getattr("MemoryPointer")?.unbind(),
        })
    })
}

/// `cupy_allocate(nbytes) -> cupy.cuda.MemoryPointer`: a CuPy allocator hook, whole, in one
/// call (`rrmm.allocators.cupy.rrmm_cupy_unowned_allocator`, RMM's design). Allocates `nbytes` from the
/// per-device resource of CuPy's current device on CuPy's current stream, and wraps it as
/// `MemoryPointer(UnownedMemory(ptr, nbytes, owner, device), 0)`, the owner freeing the memory
/// when CuPy drops it. Imports CuPy on first use; raises ImportError naming it when missing.
#[pyfunction]
fn cupy_allocate(py: Python<'_>, nbytes: usize) -> PyResult<Py<PyAny>> {
    let cupy = cupy_bindings(py)?;
    let on = AllocationStream::current(py)?;
    // SAFETY: CuPy's current stream: a live stream (or a default-stream handle).
    let stream = unsafe { Stream::from_raw(on.raw()) };
    // CuPy's current device: its runtime calls made that device's primary context current.
    let device = crate::current_device_ordinal();
    let (ptr, mr) = py_result(allocate_on(device, nbytes, stream, Context::AlreadyCurrent))?;
    let owner = Py::new(
        py,
        HookAllocation::new(ptr, nbytes, device, stream, mr).on_cupy_stream(on),
    )?;
    let memory = cupy
        .unowned_memory
        .call1(py, (ptr, nbytes, owner, device))?;
    cupy.memory_pointer.call1(py, (memory, 0))
}

/// What the C-function CuPy allocator must remember to free a pointer: CuPy's free callback
/// passes only the pointer and the device.
struct CupyLive {
    size: usize,
    stream: AllocationStream,
    mr: HookResource,
}

/// Live CuPy allocations by pointer, with the crate's one address hasher ([`crate::live`]).
type PointerMap<V> = crate::live::AddressMap<usize, V>;

fn cupy_live() -> &'static Mutex<PointerMap<CupyLive>> {
    // Why process-wide: CuPy frees by pointer alone through a C function: found by address.
    static LIVE: OnceLock<Mutex<PointerMap<CupyLive>>> = OnceLock::new();
    LIVE.get_or_init(|| Mutex::new(PointerMap::default()))
}

fn cupy_c_malloc(py: Python<'_>, size: usize, device: c_int) -> PyResult<usize> {
    let on = AllocationStream::current(py)?;
    let device = py_result(
        usize::try_from(device)
            .map_err(|_| Error::invalid("device", format!("{device} is not a device ordinal"))),
    )?;
    // SAFETY: CuPy's current stream, as in `cupy_allocate`.
    let stream = unsafe { Stream::from_raw(on.raw()) };
    let (ptr, mr) = py_result(allocate_on(device, size, stream, Context::AlreadyCurrent))?;
    if let Some(mr) = mr {
        cupy_live().lock().insert(
            ptr,
            CupyLive {
                size,
                stream: on,
                mr,
            },
        );
    }
    Ok(ptr)
}

/// CuPy's `CFunctionAllocator` malloc: `void* malloc(void* param, size_t size, int device)`,
/// called by CuPy with the GIL held. Allocates on CuPy's current stream. On failure it sets the
/// Python exception (MemoryError for out of memory) and returns `(void*)-1`, which CuPy's
/// Cython code checks (or CPython reports as an error set by a call that returned).
extern "C" fn rrmm_cupy_malloc(_param: *mut c_void, size: usize, device: c_int) -> *mut c_void {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        Python::attach(|py| match cupy_c_malloc(py, size, device) {
            Ok(ptr) => ptr,
            Err(error) => {
                error.restore(py);
                usize::MAX
            }
        })
    }));
    match outcome {
        Ok(ptr) => ptr as *mut c_void,
        Err(_) => {
            Python::attach(|py| {
                pyo3::exceptions::PyRuntimeError::new_err("rrmm: internal error in the CuPy hook")
                    .restore(py)
            });
            usize::MAX as *mut c_void
        }
    }
}

/// CuPy's `CFunctionAllocator` free: `void free(void* param, void* ptr, int device)`, called by
/// CuPy with the GIL held. Frees through the resource the pointer was allocated from, on its
/// stream (or CuPy's current one when that stream was destroyed first, see
/// [`AllocationStream`]); unknown pointers (the -1 of a failed malloc) are ignored. Never
/// unwinds.
extern "C" fn rrmm_cupy_free(_param: *mut c_void, ptr: *mut c_void, device: c_int) {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let live = cupy_live().lock().remove(&(ptr as usize));
        match live {
            Some(live) => {
                let raw = live.stream.free_handle();
                // SAFETY: a live stream: the allocation's while CuPy's object for it lives, else
                // CuPy's current one (or a default stream); the entry was removed from the live
                // table, so this frees once what `rrmm_cupy_malloc` allocated from `live.mr` with
                // `live.size`; CuPy frees only after its work on the memory is ordered before
                // (its stream-ordered contract).
                unsafe {
                    deallocate_on(
                        &live.mr,
                        usize::try_from(device).unwrap_or(0),
                        ptr as usize,
                        live.size,
                        Stream::from_raw(raw),
                    )
                }
            }
            None => Ok(()),
        }
    }));
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(error)) => report_to_stderr(format_args!(
            "rrmm: freeing a CuPy allocation failed: {error}"
        )),
        Err(_) => report_to_stderr(format_args!(
            "rrmm: internal error (panic) freeing a CuPy allocation"
        )),
    }
}

/// `cupy_c_allocator_functions() -> (malloc, free)`: addresses of C functions for
/// `cupy.cuda.memory.CFunctionAllocator(0, malloc, free, None)`, an allocator CuPy calls with
/// no Python object of rrmm's per allocation.
#[pyfunction]
fn cupy_c_allocator_functions() -> (usize, usize) {
    let malloc: extern "C" fn(*mut c_void, usize, c_int) -> *mut c_void = rrmm_cupy_malloc;
    let free: extern "C" fn(*mut c_void, *mut c_void, c_int) = rrmm_cupy_free;
    (malloc as usize, free as usize)
}

/// `cupy_c_allocation(ptr) -> (size, stream) | None`: what the C-function CuPy allocator
/// recorded for a live pointer (for tests).
#[pyfunction]
fn cupy_c_allocation(ptr: usize) -> Option<(usize, usize)> {
    cupy_live()
        .lock()
        .get(&ptr)
        .map(|live| (live.size, live.stream.raw()))
}

/// `cupy_c_live_allocations() -> int`: how many allocations of the C-function CuPy allocator are
/// live (for tests).
#[pyfunction]
fn cupy_c_live_allocations() -> usize {
    cupy_live().lock().len()
}

/// `pinned_allocate(nbytes)`: `nbytes` of pinned host memory from the current host resource
/// (`rrmm.mr.set_current_host_resource`; by default a `PinnedHostMemoryResource` made on first
/// use, on the current device).
#[pyfunction]
fn pinned_allocate(py: Python<'_>, nbytes: usize) -> PyResult<HookAllocation> {
    let (ptr, mr) = if nbytes == 0 {
        (0, None)
    } else {
        let mr = py_result(HookResource::of_host())?;
        // The GIL rule (see `gil`), as at every door into a resource.
        let ptr = py_result(crate::python::gil::call(py, mr.profile(), || {
            mr.resource().allocate(nbytes, Stream::DEFAULT)
        }))?;
        (ptr, Some(mr))
    };
    Ok(HookAllocation::new(
        ptr,
        nbytes,
        crate::current_device_ordinal(),
        Stream::DEFAULT,
        mr,
    ))
}

crate::python::register_items! {
    functions: cupy_allocate, cupy_c_allocator_functions, cupy_c_live_allocations,
        cupy_c_allocation, pinned_allocate;
}
