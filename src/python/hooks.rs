//! The hot paths of the framework hooks (`rrmm.allocators.{cupy,numba}`): one call allocates
//! from the per-device resource and returns a tiny owner object that frees itself on drop.
//!
//! CuPy wraps the owner in `UnownedMemory`, Numba calls its `free` from a finalizer; neither
//! needs a full `DeviceBuffer`, so each allocation costs one Rust call and one small object.

use super::cupy_stream::{cupy_missing, CupyStreamLookup};
use super::errors::py_result;
use crate::cuda::{self, ContextGuard};
use crate::resource::{MemoryKind, PinnedHostMemoryResource};
use crate::{per_device_resource, Error, MemoryResource, Result, SharedResource, Stream};
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyBytes;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// Makes device `device`'s primary context current while a resource of `mr`'s kind works, when
/// it needs one: never for simulated or pageable host memory, and never without a driver (so
/// the hooks run on simulated memory on machines with no GPU).
///
/// # Errors
/// The context calls' errors (a bad device ordinal among them).
pub(crate) fn context_for(mr: &dyn MemoryResource, device: usize) -> Result<Option<ContextGuard>> {
    if matches!(mr.kind(), MemoryKind::Simulated | MemoryKind::Host) || !cuda::driver_available() {
        return Ok(None);
    }
    ContextGuard::new(device).map(Some)
}

/// Allocates `bytes` on `stream` from the per-device resource of `device`; size 0 gives the null
/// pointer without asking the resource.
///
/// # Errors
/// The resource's errors (out of memory among them) and the context calls' errors.
pub(crate) fn allocate_on(
    device: usize,
    bytes: usize,
    stream: Stream,
) -> Result<(usize, Option<SharedResource>)> {
    if bytes == 0 {
        return Ok((0, None));
    }
    let mr = per_device_resource(device)?;
    let _ctx = context_for(mr.as_ref(), device)?;
    let ptr = mr.allocate(bytes, stream)?;
    Ok((ptr, Some(mr)))
}

/// [`allocate_on`] for a caller whose current context is already `device`'s (CuPy's hooks: the
/// device is CuPy's current device, whose primary context CuPy's runtime calls made current), so
/// no context guard is needed.
///
/// # Errors
/// The resource's errors.
fn allocate_on_current(
    device: usize,
    bytes: usize,
    stream: Stream,
) -> Result<(usize, Option<SharedResource>)> {
    if bytes == 0 {
        return Ok((0, None));
    }
    let mr = per_device_resource(device)?;
    let ptr = mr.allocate(bytes, stream)?;
    Ok((ptr, Some(mr)))
}

/// Frees what [`allocate_on`] returned, through the same resource and stream.
///
/// # Safety
/// 1. `ptr` came from [`allocate_on`] (or [`allocate_on_current`]) with `bytes`, which returned
///    `mr`, and has not been freed since.
/// 2. No work uses the memory after the free in `stream`'s order.
///
/// # Errors
/// The resource's errors.
pub(crate) unsafe fn deallocate_on(
    mr: &dyn MemoryResource,
    device: usize,
    ptr: usize,
    bytes: usize,
    stream: Stream,
) -> Result<()> {
    let _ctx = context_for(mr, device)?;
    // SAFETY: the caller's contract, for the resource that allocated `ptr`.
    unsafe { mr.deallocate(ptr, bytes, stream) }
}

/// One allocation made for a framework: frees itself (through its resource, on its stream) when
/// dropped or when `free()` is called, whichever comes first.
#[pyclass(module = "rrmm._rrmm", name = "HookAllocation", frozen)]
pub(crate) struct HookAllocation {
    ptr: usize,
    size: usize,
    device: usize,
    stream: Stream,
    mr: Option<SharedResource>,
    freed: AtomicBool,
}

impl HookAllocation {
    fn release(&self) -> Result<()> {
        if self.freed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        match &self.mr {
            Some(mr) if self.ptr != 0 => {
                // SAFETY: this allocation owns `ptr` (made by `allocate_on` with `size` from
                // `mr`), and the `freed` flag lets only one caller through; the framework drops
                // its last reference only after its work on the memory, on `stream`.
                unsafe { deallocate_on(mr.as_ref(), self.device, self.ptr, self.size, self.stream) }
            }
            _ => Ok(()),
        }
    }
}

#[pymethods]
impl HookAllocation {
    /// The address (0 for a size-0 allocation).
    #[getter]
    fn ptr(&self) -> usize {
        self.ptr
    }

    /// The size in bytes, as requested.
    #[getter]
    fn size(&self) -> usize {
        self.size
    }

    /// The device ordinal whose resource made the allocation.
    #[getter]
    fn device(&self) -> usize {
        self.device
    }

    /// The raw handle of the stream the allocation is ordered on.
    #[getter]
    fn stream(&self) -> usize {
        self.stream.raw()
    }

    /// Whether the memory has been given back already.
    #[getter]
    fn freed(&self) -> bool {
        self.freed.load(Ordering::Acquire)
    }

    /// Gives the memory back now (later calls and the drop do nothing).
    fn free(&self) -> PyResult<()> {
        py_result(self.release())
    }

    fn __int__(&self) -> usize {
        self.ptr
    }

    fn __repr__(&self) -> String {
        format!(
            "HookAllocation(ptr={:#x}, size={}, device={}, stream={:#x}{})",
            self.ptr,
            self.size,
            self.device,
            self.stream.raw(),
            if self.freed() { ", freed" } else { "" }
        )
    }
}

impl Drop for HookAllocation {
    fn drop(&mut self) {
        if let Err(error) = self.release() {
            // A destructor cannot raise; say it rather than lose it.
            eprintln!("rrmm: freeing a framework allocation failed: {error}");
        }
    }
}

/// `hook_allocate(nbytes, stream, device)`: allocates `nbytes` on the raw stream handle `stream`
/// from the per-device resource of `device`. The hot path of the CuPy and Numba hooks.
#[pyfunction]
fn hook_allocate(nbytes: usize, stream: usize, device: usize) -> PyResult<HookAllocation> {
    // SAFETY: the hooks pass the framework's current stream of `device` (CuPy, Numba), a live
    // stream or a default-stream handle, which the framework keeps live while it uses memory
    // allocated on it.
    let stream = unsafe { Stream::from_raw(stream) };
    let (ptr, mr) = py_result(allocate_on(device, nbytes, stream))?;
    Ok(HookAllocation {
        ptr,
        size: nbytes,
        device,
        stream,
        mr,
        freed: AtomicBool::new(false),
    })
}

/// CuPy's callables the CuPy hook needs, looked up once.
struct CupyBindings {
    unowned_memory: Py<PyAny>,
    memory_pointer: Py<PyAny>,
}

fn cupy_bindings(py: Python<'_>) -> PyResult<&'static CupyBindings> {
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
    // SAFETY: CuPy's current stream: a live stream (or a default-stream handle) that CuPy keeps
    // live while it uses memory allocated on it.
    let stream = unsafe { Stream::from_raw(CupyStreamLookup::get(py)?.current_stream(py)?) };
    // CuPy's current device: its runtime calls made that device's primary context current.
    let device = crate::current_device_ordinal();
    let (ptr, mr) = py_result(allocate_on_current(device, nbytes, stream))?;
    let owner = Py::new(
        py,
        HookAllocation {
            ptr,
            size: nbytes,
            device,
            stream,
            mr,
            freed: AtomicBool::new(false),
        },
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
    stream: Stream,
    mr: SharedResource,
}

/// Hashes device pointers (256-byte aligned) with one multiplication, far cheaper than the
/// default SipHash on the allocate/free path of every CuPy array.
#[derive(Default)]
struct PointerHasher(u64);

impl std::hash::Hasher for PointerHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_usize(&mut self, value: usize) {
        self.0 = ((value as u64) >> 8).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type PointerMap<V> = HashMap<usize, V, std::hash::BuildHasherDefault<PointerHasher>>;

fn cupy_live() -> &'static Mutex<PointerMap<CupyLive>> {
    static LIVE: OnceLock<Mutex<PointerMap<CupyLive>>> = OnceLock::new();
    LIVE.get_or_init(|| Mutex::new(PointerMap::default()))
}

fn cupy_c_malloc(py: Python<'_>, size: usize, device: c_int) -> PyResult<usize> {
    let stream = CupyStreamLookup::get(py)?.current_stream(py)?;
    let device = py_result(
        usize::try_from(device)
            .map_err(|_| Error::invalid("device", format!("{device} is not a device ordinal"))),
    )?;
    // SAFETY: CuPy's current stream, as in `cupy_allocate`.
    let stream = unsafe { Stream::from_raw(stream) };
    let (ptr, mr) = py_result(allocate_on_current(device, size, stream))?;
    if let Some(mr) = mr {
        cupy_live()
            .lock()
            .insert(ptr, CupyLive { size, stream, mr });
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

/// CuPy's `CFunctionAllocator` free: `void free(void* param, void* ptr, int device)`. Frees
/// through the resource and stream the pointer was allocated with; unknown pointers (the -1 of
/// a failed malloc) are ignored. Never unwinds.
extern "C" fn rrmm_cupy_free(_param: *mut c_void, ptr: *mut c_void, device: c_int) {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let live = cupy_live().lock().remove(&(ptr as usize));
        match live {
            // SAFETY: the entry was removed from the live table, so this frees once what
            // `cupy_c_malloc` allocated from `live.mr` with `live.size`; CuPy frees only after
            // its work on the memory is ordered before (its stream-ordered contract).
            Some(live) => unsafe {
                deallocate_on(
                    live.mr.as_ref(),
                    usize::try_from(device).unwrap_or(0),
                    ptr as usize,
                    live.size,
                    live.stream,
                )
            },
            None => Ok(()),
        }
    }));
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(error)) => eprintln!("rrmm: freeing a CuPy allocation failed: {error}"),
        Err(_) => eprintln!("rrmm: internal error (panic) freeing a CuPy allocation"),
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

fn pinned_resource() -> Result<SharedResource> {
    static PINNED: OnceLock<SharedResource> = OnceLock::new();
    if let Some(mr) = PINNED.get() {
        return Ok(mr.clone());
    }
    let mr: SharedResource = Arc::new(PinnedHostMemoryResource::new()?);
    Ok(PINNED.get_or_init(|| mr).clone())
}

/// `pinned_allocate(nbytes)`: `nbytes` of pinned host memory from a process-wide
/// `PinnedHostMemoryResource` (made on first use, on the current device).
#[pyfunction]
fn pinned_allocate(nbytes: usize) -> PyResult<HookAllocation> {
    let (ptr, mr) = if nbytes == 0 {
        (0, None)
    } else {
        let mr = py_result(pinned_resource())?;
        let ptr = py_result(mr.allocate(nbytes, Stream::DEFAULT))?;
        (ptr, Some(mr))
    };
    Ok(HookAllocation {
        ptr,
        size: nbytes,
        device: py_result(cuda::current_device()).unwrap_or(0),
        stream: Stream::DEFAULT,
        mr,
        freed: AtomicBool::new(false),
    })
}

/// `ipc_mem_handle(ptr) -> (bytes, offset)`: the 64-byte `cuIpcGetMemHandle` handle of the
/// allocation containing device address `ptr` (in the current context), and `ptr`'s offset
/// from that allocation's base.
#[pyfunction]
fn ipc_mem_handle<'py>(py: Python<'py>, ptr: usize) -> PyResult<(Bound<'py, PyBytes>, usize)> {
    if ptr == 0 {
        return py_result(Err(Error::invalid(
            "ptr",
            "the null pointer has no IPC handle",
        )));
    }
    let (handle, offset) = py_result(cuda::ipc_mem_handle(ptr))?;
    Ok((PyBytes::new(py, &handle), offset))
}

/// `device_memory_info(device) -> (free, total)`: `cuMemGetInfo` of device `device`, with its
/// primary context current for the call.
#[pyfunction]
fn device_memory_info(device: usize) -> PyResult<(usize, usize)> {
    let _ctx = py_result(ContextGuard::new(device))?;
    py_result(cuda::mem_get_info())
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<HookAllocation>()?;
    m.add_function(wrap_pyfunction!(device_memory_info, m)?)?;
    m.add_function(wrap_pyfunction!(hook_allocate, m)?)?;
    m.add_function(wrap_pyfunction!(cupy_allocate, m)?)?;
    m.add_function(wrap_pyfunction!(cupy_c_allocator_functions, m)?)?;
    m.add_function(wrap_pyfunction!(cupy_c_live_allocations, m)?)?;
    m.add_function(wrap_pyfunction!(cupy_c_allocation, m)?)?;
    m.add_function(wrap_pyfunction!(pinned_allocate, m)?)?;
    m.add_function(wrap_pyfunction!(ipc_mem_handle, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{set_per_device_resource, SimulatedMemoryResource};

    #[test]
    fn allocate_and_free_go_through_the_per_device_resource() {
        let sim = Arc::new(SimulatedMemoryResource::new(1 << 20));
        set_per_device_resource(801, sim.clone());
        // SAFETY: a key only: simulated memory never passes it to the driver.
        let stream = unsafe { Stream::from_raw(0x1234) };
        let (ptr, mr) = allocate_on(801, 1000, stream).unwrap();
        assert_ne!(ptr, 0);
        assert_eq!(sim.live_allocations(), 1);
        // SAFETY: `ptr` was just allocated with 1000 bytes from `mr` and is freed once.
        unsafe { deallocate_on(mr.unwrap().as_ref(), 801, ptr, 1000, stream) }.unwrap();
        assert_eq!(sim.live_allocations(), 0);
    }

    #[test]
    fn size_zero_asks_nothing_and_oom_is_an_error() {
        let sim = Arc::new(SimulatedMemoryResource::new(1 << 20));
        set_per_device_resource(802, sim.clone());
        let (ptr, mr) = allocate_on(802, 0, Stream::DEFAULT).unwrap();
        assert_eq!((ptr, mr.is_none()), (0, true));
        assert!(matches!(
            allocate_on(802, 2 << 20, Stream::DEFAULT),
            Err(Error::OutOfMemory { .. })
        ));
        assert_eq!(sim.live_allocations(), 0);
    }

    #[test]
    fn a_hook_allocation_frees_once() {
        let sim = Arc::new(SimulatedMemoryResource::new(1 << 20));
        set_per_device_resource(803, sim.clone());
        let (ptr, mr) = allocate_on(803, 4096, Stream::DEFAULT).unwrap();
        let a = HookAllocation {
            ptr,
            size: 4096,
            device: 803,
            stream: Stream::DEFAULT,
            mr,
            freed: AtomicBool::new(false),
        };
        assert_eq!(sim.live_allocations(), 1);
        a.release().unwrap();
        assert_eq!(sim.live_allocations(), 0);
        a.release().unwrap();
        drop(a);
        assert_eq!(sim.bytes_in_use(), 0);
    }
}
