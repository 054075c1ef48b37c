//! What the framework hooks (`cupy`, `numba`, `torch`) share: allocating from and freeing to the
//! per-device resource with the device's context current, and `HookAllocation`, a tiny owner
//! object that frees its allocation on drop.
//!
//! CuPy wraps the owner in `UnownedMemory`, Numba keeps it on its `MemoryPointer`; neither needs
//! a full `DeviceBuffer`, so each allocation costs one Rust call and one small object.

use super::cupy_stream::AllocationStream;
use crate::cuda::{self, ContextGuard};
use crate::python::errors::{py_result, report_to_stderr};
use crate::resource::memory_summary::explain_out_of_memory;
use crate::resource::Calls;
use crate::resource::MemoryKind;
use crate::{per_device_resource_and_calls, MemoryResource, Result, SharedResource, Stream};
use pyo3::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Makes device `device`'s primary context current while a resource of `mr`'s kind works, when
/// it needs one: never for simulated or pageable host memory, and never without a driver (so
/// the hooks run on simulated memory on machines with no GPU).
///
/// # Errors
/// The context calls' errors (a bad device ordinal among them).
pub(super) fn context_for(mr: &dyn MemoryResource, device: usize) -> Result<Option<ContextGuard>> {
    if matches!(mr.kind(), MemoryKind::Simulated | MemoryKind::Host) || !cuda::driver_available() {
        return Ok(None);
    }
    ContextGuard::new(device).map(Some)
}

/// A resource the hooks allocate from, with its link's calls kept (the GIL decision around each
/// call is one load).
#[derive(Clone, Debug)]
pub(crate) struct HookResource {
    mr: SharedResource,
    calls: Calls,
}

impl HookResource {
    /// The current host resource (the calls kept with it in its slot).
    ///
    /// # Errors
    /// As [`crate::current_host_resource`].
    pub(crate) fn of_host() -> Result<Self> {
        let (mr, calls) = crate::current_host_resource_and_calls()?;
        Ok(HookResource { mr, calls })
    }

    /// The per-device resource of `device` (the calls kept per thread with it).
    ///
    /// # Errors
    /// As [`crate::per_device_resource`].
    pub(crate) fn of_device(device: usize) -> Result<Self> {
        let (mr, calls) = per_device_resource_and_calls(device)?;
        Ok(HookResource { mr, calls })
    }

    /// The resource.
    pub(crate) fn resource(&self) -> &SharedResource {
        &self.mr
    }

    /// What a call into it may do now.
    #[inline]
    pub(crate) fn profile(&self) -> crate::resource::CallProfile {
        self.calls.get()
    }
}

/// Live allocations of the hooks from resource chains that run foreign code (a Python
/// callback): holders rrmm cannot see from Python, which keep a collected callback resource's
/// memory from being given back (see `callback`).
// Why process-wide: the framework allocators are process-wide, so is their count.
static FOREIGN_HOOK_ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

/// How many hook allocations from chains that run foreign code are live.
pub(crate) fn foreign_hook_allocations() -> usize {
    FOREIGN_HOOK_ALLOCATIONS.load(Ordering::Acquire)
}

/// Whether an allocation must make the device's context current first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Context {
    /// Make the device's primary context current for the call (PyTorch, Numba: the caller's
    /// context may be another device's).
    Make,
    /// The caller's current context is already the device's (CuPy's hooks: the device is CuPy's
    /// current device, whose primary context CuPy's runtime calls made current).
    AlreadyCurrent,
}

/// Allocates `bytes` on `stream` from the per-device resource of `device`; size 0 gives the null
/// pointer without asking the resource.
///
/// # Errors
/// The resource's errors (out of memory among them) and the context calls' errors.
pub(super) fn allocate_on(
    device: usize,
    bytes: usize,
    stream: Stream,
    context: Context,
) -> Result<(usize, Option<HookResource>)> {
    if bytes == 0 {
        return Ok((0, None));
    }
    allocate_from(
        HookResource::of_device(device)?,
        device,
        bytes,
        stream,
        context,
    )
}

/// As [`allocate_on`], from `hooked` (the per-device resource of `device` with its calls,
/// already looked up), for `bytes` > 0.
///
/// # Errors
/// As [`allocate_on`].
pub(super) fn allocate_from(
    hooked: HookResource,
    device: usize,
    bytes: usize,
    stream: Stream,
    context: Context,
) -> Result<(usize, Option<HookResource>)> {
    let mr = &hooked.mr;
    let _ctx = match context {
        Context::Make => context_for(mr.as_ref(), device)?,
        Context::AlreadyCurrent => None,
    };
    // The one GIL rule (see `gil`): released when the resource may block or reach Python (a
    // pool over a callback grows under its lock; the callback takes the GIL back), whoever
    // calls (CuPy holds the GIL, PyTorch mostly does not).
    let profile = hooked.profile();
    // The allocation's door: an ask of the processes sharing the GPU runs outside the
    // resource's locks and without the GIL.
    let ptr = crate::python::gil::allocate_from_foreign(profile, || mr.allocate(bytes, stream))
        .map_err(|e| explain_out_of_memory(e, mr, bytes, stream))?;
    if profile.calls_foreign_code {
        FOREIGN_HOOK_ALLOCATIONS.fetch_add(1, Ordering::AcqRel);
    }
    super::history::record("alloc", device, ptr, bytes, stream.raw());
    Ok((ptr, Some(hooked)))
}

/// Frees what [`allocate_on`] returned, through the same resource and stream.
///
/// # Errors
/// The resource's errors.
///
/// # Safety
/// 1. `ptr` came from [`allocate_on`] with `bytes`, which returned `hooked`, and has not been freed
///    since.
/// 2. No work uses the memory after the free in `stream`'s order.
pub(super) unsafe fn deallocate_on(
    hooked: &HookResource,
    device: usize,
    ptr: usize,
    bytes: usize,
    stream: Stream,
) -> Result<()> {
    let mr = hooked.mr.as_ref();
    super::history::record("free_completed", device, ptr, bytes, stream.raw());
    // The GIL rule, as in `allocate_from` (CuPy frees with the GIL held).
    let profile = hooked.profile();
    let freed = crate::python::gil::call_from_foreign(profile, || {
        let _ctx = context_for(mr, device)?;
        // SAFETY: the caller's contract, for the resource that allocated `ptr`.
        unsafe { mr.deallocate(ptr, bytes, stream) }
    });
    if profile.calls_foreign_code {
        // Saturating: a chain that gained a foreign bin after the allocation was counted.
        let _ = FOREIGN_HOOK_ALLOCATIONS.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            Some(n.saturating_sub(1))
        });
    }
    freed
}

/// One allocation made for a framework: frees itself (through its resource, on its stream) when
/// dropped or when `free()` is called, whichever comes first.
#[pyclass(module = "rrmm._rrmm", name = "HookAllocation", frozen)]
pub(super) struct HookAllocation {
    /// The address (0 for a size-0 allocation).
    #[pyo3(get)]
    ptr: usize,
    /// The size in bytes, as requested.
    #[pyo3(get)]
    size: usize,
    /// The device ordinal whose resource made the allocation.
    #[pyo3(get)]
    device: usize,
    stream: Stream,
    /// For an allocation on a CuPy stream: the stream to free on once CuPy's stream object is
    /// gone (see [`AllocationStream`]).
    cupy_stream: Option<AllocationStream>,
    mr: Option<HookResource>,
    freed: AtomicBool,
}

impl HookAllocation {
    /// The owner of an allocation `allocate_on` (or another resource) made: `ptr` of `size`
    /// bytes from `mr` (None for size 0) for `device`, ordered on `stream`.
    pub(crate) fn new(
        ptr: usize,
        size: usize,
        device: usize,
        stream: Stream,
        mr: Option<HookResource>,
    ) -> Self {
        HookAllocation {
            ptr,
            size,
            device,
            stream,
            cupy_stream: None,
            mr,
            freed: AtomicBool::new(false),
        }
    }

    /// The same owner for an allocation made on CuPy stream `on` (which CuPy may destroy before
    /// the memory is freed).
    pub(crate) fn on_cupy_stream(mut self, on: AllocationStream) -> Self {
        self.cupy_stream = Some(on);
        self
    }

    /// The stream to free on: the allocation's, unless CuPy destroyed it.
    fn free_stream(&self) -> Stream {
        match &self.cupy_stream {
            // SAFETY: `for_free` gives a live stream (the allocation's while CuPy's object for
            // it lives, else CuPy's current one, or a default stream).
            Some(on) => unsafe { Stream::from_raw(on.free_handle()) },
            None => self.stream,
        }
    }

    fn release(&self) -> Result<()> {
        if self.freed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        match &self.mr {
            Some(mr) if self.ptr != 0 => {
                // SAFETY: this allocation owns `ptr` (made by `allocate_on` with `size` from
                // `mr`), and the `freed` flag lets only one caller through; the framework drops
                // its last reference only after its work on the memory, on `stream`.
                unsafe { deallocate_on(mr, self.device, self.ptr, self.size, self.free_stream()) }
            }
            _ => Ok(()),
        }
    }
}

#[pymethods]
impl HookAllocation {
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
            report_to_stderr(format_args!(
                "rrmm: freeing a framework allocation failed: {error}"
            ));
        }
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<HookAllocation>()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{set_per_device_resource, Error, SimulatedMemoryResource};
    use std::sync::Arc;

    /// A 1 MiB simulated device, set as the resource of the (made-up) device `ordinal`.
    fn simulated_on(ordinal: usize) -> Arc<SimulatedMemoryResource> {
        let sim = Arc::new(SimulatedMemoryResource::new(1 << 20));
        set_per_device_resource(ordinal, sim.clone()).unwrap();
        sim
    }

    #[test]
    fn allocate_and_free_go_through_the_per_device_resource() {
        let sim = simulated_on(801);
        // SAFETY: a key only: simulated memory never passes it to the driver.
        let stream = unsafe { Stream::from_raw(0x1234) };
        let (ptr, mr) = allocate_on(801, 1000, stream, Context::Make).unwrap();
        assert_ne!(ptr, 0);
        assert_eq!(sim.live_allocations(), 1);
        // SAFETY: `ptr` was just allocated with 1000 bytes from `mr` and is freed once.
        unsafe { deallocate_on(&mr.unwrap(), 801, ptr, 1000, stream) }.unwrap();
        assert_eq!(sim.live_allocations(), 0);
    }

    #[test]
    fn size_zero_asks_nothing_and_oom_is_an_error() {
        let sim = simulated_on(802);
        let (ptr, mr) = allocate_on(802, 0, Stream::DEFAULT, Context::Make).unwrap();
        assert_eq!((ptr, mr.is_none()), (0, true));
        assert!(matches!(
            allocate_on(802, 2 << 20, Stream::DEFAULT, Context::Make),
            Err(Error::OutOfMemory { .. })
        ));
        assert_eq!(sim.live_allocations(), 0);
    }

    #[test]
    fn a_hook_allocation_frees_once() {
        let sim = simulated_on(803);
        let (ptr, mr) = allocate_on(803, 4096, Stream::DEFAULT, Context::AlreadyCurrent).unwrap();
        let a = HookAllocation::new(ptr, 4096, 803, Stream::DEFAULT, mr);
        assert_eq!(sim.live_allocations(), 1);
        a.release().unwrap();
        assert_eq!(sim.live_allocations(), 0);
        a.release().unwrap();
        drop(a);
        assert_eq!(sim.bytes_in_use(), 0);
    }
}
