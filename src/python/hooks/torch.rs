//! PyTorch's pluggable allocator over rrmm: the C entry points `rrmm_torch_allocate` and
//! `rrmm_torch_deallocate`, exported by rrmm's own extension module, for
//! `torch.cuda.memory.CUDAPluggableAllocator(<path of _rrmm>, "rrmm_torch_allocate",
//! "rrmm_torch_deallocate")`.
//!
//! Signatures are the ones PyTorch calls: `void* alloc(size_t size, int device, cudaStream_t
//! stream)` and `void free(void* ptr, size_t size, int device, cudaStream_t stream)`. Each uses
//! the per-device resource of `device` on `stream`, with the device's primary context current
//! for the call (the caller's context is restored). No Rust panic crosses the C boundary. On
//! failure the allocator throws a C++ exception whose `what()` is rrmm's message (PyTorch does not
//! check the returned pointer, so a null return would not be noticed): PyTorch's own
//! `c10::OutOfMemoryError`, found in the loaded PyTorch libraries by the shim
//! csrc/torch_shim.cpp, so Python code sees `torch.cuda.OutOfMemoryError` as with PyTorch's
//! allocator; a `std::bad_alloc` (PyTorch's `RuntimeError`) when PyTorch's type cannot be found.

use super::errors::report_to_stderr;
use super::hooks::{allocate_on, deallocate_on, Context};
use crate::{per_device_resource, Error, Result, Stream};
use pyo3::prelude::*;
use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The exported names, for `CUDAPluggableAllocator`.
pub(crate) const ALLOCATE_SYMBOL: &str = "rrmm_torch_allocate";
/// The exported name of the free function.
pub(crate) const DEALLOCATE_SYMBOL: &str = "rrmm_torch_deallocate";

extern "C-unwind" {
    /// Throws PyTorch's `c10::OutOfMemoryError` (when PyTorch is loaded) or a
    /// `std::bad_alloc`-derived exception, carrying a copy of `message`; never returns.
    fn rrmm_torch_throw_out_of_memory(message: *const c_char) -> !;
}

fn device_ordinal(device: c_int) -> Result<usize> {
    usize::try_from(device)
        .map_err(|_| Error::invalid("device", format!("{device} is not a device ordinal")))
}

fn allocate(size: usize, device: c_int, stream: usize) -> Result<usize> {
    let device = device_ordinal(device)?;
    // SAFETY: `rrmm_torch_allocate`'s contract: a live stream of `device` or a default stream.
    let stream = unsafe { Stream::from_raw(stream) };
    let (ptr, _mr) = allocate_on(device, size, stream, Context::Make)?;
    Ok(ptr)
}

fn deallocate(ptr: usize, size: usize, device: c_int, stream: usize) -> Result<()> {
    if ptr == 0 {
        return Ok(());
    }
    let device = device_ordinal(device)?;
    let mr = per_device_resource(device)?;
    // SAFETY: `rrmm_torch_deallocate`'s contract (PyTorch's pluggable allocator): `ptr` came from
    // `rrmm_torch_allocate` with `size` on `device` and `stream`, and is freed once, after its work.
    unsafe { deallocate_on(mr.as_ref(), device, ptr, size, Stream::from_raw(stream)) }
}

/// The message as a NUL-terminated C string in a fixed buffer (no destructor to run when the
/// C++ exception unwinds through the caller's frame). Interior NULs become spaces; long messages
/// are cut.
fn message_buffer(text: &str) -> [u8; 1024] {
    let mut buf = [0u8; 1024];
    for (dst, &src) in buf.iter_mut().zip(text.as_bytes().iter().take(1023)) {
        *dst = if src == 0 { b' ' } else { src };
    }
    buf
}

/// Allocates for PyTorch: `size` bytes on `stream` from the per-device resource of `device`.
/// Size 0 gives the null pointer. Exported from the extension module.
///
/// # Safety
/// Called by PyTorch (or C code) with a `stream` that is a live stream of `device` or a default
/// stream handle. On failure this function throws a C++ exception: it must be called from C++
/// (or through a `"C-unwind"` declaration) that is prepared for one, as PyTorch is.
#[no_mangle]
pub unsafe extern "C-unwind" fn rrmm_torch_allocate(
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    let outcome = catch_unwind(AssertUnwindSafe(|| allocate(size, device, stream as usize)));
    let buf = match outcome {
        Ok(Ok(ptr)) => return ptr as *mut c_void,
        Ok(Err(error)) => message_buffer(&error.to_string()),
        Err(_) => message_buffer("rrmm: internal error (panic) in rrmm_torch_allocate"),
    };
    // SAFETY: `buf` is NUL-terminated (at most 1023 bytes of text) and lives in this frame; the
    // shim copies it before throwing. The exception unwinds through this `"C-unwind"` frame,
    // which owns nothing that needs dropping.
    unsafe { rrmm_torch_throw_out_of_memory(buf.as_ptr().cast()) }
}

/// Frees for PyTorch what [`rrmm_torch_allocate`] returned, through the per-device resource of
/// `device` on `stream`. Never unwinds: a failure is reported on standard error.
///
/// # Safety
/// `ptr` and `size` must be an allocation from [`rrmm_torch_allocate`] for the same `device`
/// (or null); `stream` as for [`rrmm_torch_allocate`].
#[no_mangle]
pub unsafe extern "C" fn rrmm_torch_deallocate(
    ptr: *mut c_void,
    size: usize,
    device: c_int,
    stream: *mut c_void,
) {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        deallocate(ptr as usize, size, device, stream as usize)
    }));
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            report_to_stderr(format_args!("rrmm: rrmm_torch_deallocate failed: {error}"))
        }
        Err(_) => report_to_stderr(format_args!(
            "rrmm: internal error (panic) in rrmm_torch_deallocate"
        )),
    }
}

/// `torch_allocator_symbols() -> (alloc_name, free_name)`: the names to give
/// `CUDAPluggableAllocator` along with the path of this module.
#[pyfunction]
fn torch_allocator_symbols() -> (&'static str, &'static str) {
    (ALLOCATE_SYMBOL, DEALLOCATE_SYMBOL)
}

/// `torch_allocator_addresses() -> (alloc, free)`: the addresses of the two entry points (for
/// checks that the path's symbols are the ones in this process).
#[pyfunction]
fn torch_allocator_addresses() -> (usize, usize) {
    let allocate: unsafe extern "C-unwind" fn(usize, c_int, *mut c_void) -> *mut c_void =
        rrmm_torch_allocate;
    let deallocate: unsafe extern "C" fn(*mut c_void, usize, c_int, *mut c_void) =
        rrmm_torch_deallocate;
    (allocate as usize, deallocate as usize)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(torch_allocator_symbols, m)?)?;
    m.add_function(wrap_pyfunction!(torch_allocator_addresses, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{set_per_device_resource, SimulatedMemoryResource, SystemMemoryResource};
    use std::sync::Arc;

    extern "C-unwind" {
        fn rrmm_torch_shim_call_allocate(
            size: usize,
            device: c_int,
            stream: *mut c_void,
            out: *mut *mut c_void,
            message: *mut c_char,
            capacity: usize,
        ) -> c_int;
    }

    /// Calls the exported allocator from C++ as PyTorch does: `Ok(ptr)` or `Err(what())`.
    fn call_from_cpp(
        size: usize,
        device: c_int,
        stream: usize,
    ) -> std::result::Result<usize, String> {
        let mut out: *mut c_void = std::ptr::null_mut();
        let mut message = [0u8; 1024];
        // SAFETY: valid out-pointer and message buffer of the stated capacity.
        let code = unsafe {
            rrmm_torch_shim_call_allocate(
                size,
                device,
                stream as *mut c_void,
                &mut out,
                message.as_mut_ptr().cast(),
                message.len(),
            )
        };
        match code {
            0 => Ok(out as usize),
            1 | 3 => {
                let end = message
                    .iter()
                    .position(|&b| b == 0)
                    .unwrap_or(message.len());
                Err(String::from_utf8_lossy(&message[..end]).into_owned())
            }
            other => panic!("unexpected exception kind {other}"),
        }
    }

    #[test]
    fn allocate_and_free_through_the_c_abi_use_the_device_resource() {
        let sim = Arc::new(SimulatedMemoryResource::new(1 << 20));
        set_per_device_resource(901, sim.clone()).unwrap();
        let ptr = call_from_cpp(4096, 901, 0x77).unwrap();
        assert_ne!(ptr, 0);
        assert_eq!(sim.bytes_in_use(), 4096);
        // SAFETY: `ptr` came from the allocator for device 901 with this size.
        unsafe { rrmm_torch_deallocate(ptr as *mut c_void, 4096, 901, 0x77 as *mut c_void) };
        assert_eq!(sim.live_allocations(), 0);
    }

    #[test]
    fn out_of_memory_throws_bad_alloc_with_rrmms_message() {
        let sim = Arc::new(SimulatedMemoryResource::new(1 << 20));
        set_per_device_resource(902, sim.clone()).unwrap();
        let err = call_from_cpp(2 << 20, 902, 0).unwrap_err();
        assert!(
            err.contains("out of memory") || err.contains("2097152"),
            "{err}"
        );
        assert_eq!(sim.live_allocations(), 0);
        // The allocator still works after a throw.
        let ptr = call_from_cpp(256, 902, 0).unwrap();
        // SAFETY: as above.
        unsafe { rrmm_torch_deallocate(ptr as *mut c_void, 256, 902, std::ptr::null_mut()) };
    }

    #[test]
    fn bad_device_throws_and_size_zero_is_null() {
        let err = call_from_cpp(64, -1, 0).unwrap_err();
        assert!(err.contains("device"), "{err}");
        set_per_device_resource(903, Arc::new(SimulatedMemoryResource::new(1 << 20))).unwrap();
        assert_eq!(call_from_cpp(0, 903, 0).unwrap(), 0);
        // SAFETY: freeing null is a no-op.
        unsafe { rrmm_torch_deallocate(std::ptr::null_mut(), 0, 903, std::ptr::null_mut()) };
    }

    #[test]
    fn system_memory_is_real_and_freeing_errors_do_not_unwind() {
        set_per_device_resource(904, Arc::new(SystemMemoryResource::new())).unwrap();
        let ptr = call_from_cpp(1000, 904, 0).unwrap();
        // SAFETY: 1000 bytes of host memory were just allocated at `ptr`.
        unsafe { std::ptr::write_bytes(ptr as *mut u8, 1, 1000) };
        // SAFETY: as above.
        unsafe { rrmm_torch_deallocate(ptr as *mut c_void, 1000, 904, std::ptr::null_mut()) };
        // A pointer the simulated resource never gave out: an error, reported, not unwound.
        set_per_device_resource(905, Arc::new(SimulatedMemoryResource::new(1 << 20))).unwrap();
        // SAFETY: the simulated resource touches no memory; the bad free is an error value.
        unsafe { rrmm_torch_deallocate(0x1000 as *mut c_void, 64, 905, std::ptr::null_mut()) };
    }

    #[test]
    fn message_buffer_is_terminated_and_cut() {
        let long = "x".repeat(5000);
        let buf = message_buffer(&long);
        assert_eq!(buf[1023], 0);
        assert_eq!(message_buffer("a\0b")[..4], *b"a b\0");
    }
}
