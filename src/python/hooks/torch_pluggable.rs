//! PyTorch's pluggable allocator over rrmm: the C entry points `rrmm_torch_allocate` and
//! `rrmm_torch_deallocate`, exported by rrmm's own extension module, for
//! `torch.cuda.memory.CUDAPluggableAllocator(<the extension module's path>, "rrmm_torch_allocate",
//! "rrmm_torch_deallocate")`.
//!
//! Signatures are the ones PyTorch calls: `void* alloc(size_t size, int device, cudaStream_t
//! stream)` and `void free(void* ptr, size_t size, int device, cudaStream_t stream)`. Each uses
//! the per-device resource of `device` on `stream`, with the device's primary context current
//! for the call (the caller's context is restored). No Rust panic crosses the C boundary. On
//! failure the allocator throws a C++ exception whose `what()` is rrmm's message (PyTorch does not
//! check the returned pointer, so a null return would not be noticed), through PyTorch's own C++
//! runtime (the shim csrc/torch_shim.cpp finds it in the loaded PyTorch libraries):
//! `c10::OutOfMemoryError` (Python sees `torch.cuda.OutOfMemoryError`, as with PyTorch's
//! allocator) for the PyTorch versions rrmm was tested with ([`TESTED_TORCH`], told by
//! [`torch_shim_configure`] at set-up), `rrmm::out_of_memory`, a `std::bad_alloc` (PyTorch's
//! `RuntimeError`), for any other; without a PyTorch runtime in the process it says so once on
//! standard error and returns null.
//!
//! The exception unwinds through `rrmm_torch_allocate`, which therefore owns nothing to drop and
//! so has no landing pad: the unwinder is PyTorch's (libgcc's), not the one linked into this
//! module (a release wheel links zig's), and must never call this module's personality routine.

use super::shared::{allocate_on, deallocate_on, Context};
use crate::python::errors::report_to_stderr;
use crate::{Error, Result, Stream};
use pyo3::prelude::*;
use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The exported names, for `CUDAPluggableAllocator`.
pub(super) const ALLOCATE_SYMBOL: &str = "rrmm_torch_allocate";
/// The exported name of the free function.
pub(super) const DEALLOCATE_SYMBOL: &str = "rrmm_torch_deallocate";

extern "C-unwind" {
    /// Throws PyTorch's `c10::OutOfMemoryError` or `rrmm::out_of_memory` (a `std::bad_alloc`)
    /// through PyTorch's C++ runtime, carrying a copy of `message`; returns only when no PyTorch
    /// runtime is loaded (said once on standard error).
    fn rrmm_torch_raise_out_of_memory(message: *const c_char);
}

extern "C" {
    /// Tells the shim the expected size of `c10::Error`'s vtable in the loaded (tested) PyTorch,
    /// 0 for an untested version; returns the out-of-memory mode (see [`ShimMode`]).
    fn rrmm_torch_shim_configure(tested_vtable_bytes: usize) -> c_int;
}

/// A PyTorch release rrmm's allocator hook was tested with, and what the shim checks of its
/// `c10::OutOfMemoryError` before forging one (csrc/torch_shim.cpp).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TestedTorch {
    /// `major.minor` of the release (any patch release of it, any local build tag such as
    /// `+cu130`; not pre-releases).
    pub(crate) release: (u32, u32),
    /// The size of `c10::Error`'s (and `c10::OutOfMemoryError`'s) vtable in its libraries.
    pub(crate) error_vtable_bytes: usize,
}

/// The PyTorch releases whose `c10::OutOfMemoryError` the shim builds; any other version gets
/// `rrmm::out_of_memory` (a `std::bad_alloc`, PyTorch's `RuntimeError`). 2.11 is checked end to
/// end on a GPU (tests/python/test_hooks_torch.py); each of 2.9 to 2.15 on CPU against the
/// release's own libc10.so/libc10_cuda.so (`RRMM_TEST_TORCH_LIB` in
/// tests/python/test_torch_out_of_memory.py, the cp311 manylinux_2_28 x86_64 wheels): the shim's
/// layout checks pass, the object is caught as `c10::OutOfMemoryError` through PyTorch's
/// libstdc++ with rrmm's message, and OutOfMemoryError's destructor is c10::Error's with nothing
/// before it (the class has no member of its own). Add a release only after the same checks.
pub(super) const TESTED_TORCH: &[TestedTorch] = &[
    tested(2, 9),
    tested(2, 10),
    tested(2, 11),
    tested(2, 12),
    tested(2, 13),
    tested(2, 14),
    tested(2, 15),
];

/// A tested release whose `c10::Error` vtable has its 2.9 to 2.15 size: two destructors,
/// `what()` and `what_without_backtrace()`.
const fn tested(major: u32, minor: u32) -> TestedTorch {
    TestedTorch {
        release: (major, minor),
        error_vtable_bytes: 48,
    }
}

/// The tested release `version` (a `torch.__version__`) belongs to: `major.minor.patch` with an
/// optional `+local` tag; pre-releases, development builds and anything else are untested.
pub(super) fn tested_torch(version: &str) -> Option<TestedTorch> {
    let public = version
        .split_once('+')
        .map_or(version, |(public, _)| public);
    let mut parts = public.split('.');
    let mut number = || -> Option<u32> {
        let part = parts.next()?;
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        part.parse().ok()
    };
    let release = (number()?, number()?);
    number()?;
    if parts.next().is_some() {
        return None;
    }
    TESTED_TORCH.iter().copied().find(|t| t.release == release)
}

/// How an allocation failure reaches PyTorch, as the shim reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ShimMode {
    /// `c10::OutOfMemoryError` (`torch.cuda.OutOfMemoryError` in Python).
    OutOfMemoryError,
    /// `rrmm::out_of_memory`, a `std::bad_alloc` (`RuntimeError` in Python).
    BadAlloc,
    /// No PyTorch C++ runtime loaded: the allocator returns null.
    Null,
}

impl ShimMode {
    fn from_code(code: c_int) -> Self {
        match code {
            0 => Self::OutOfMemoryError,
            1 => Self::BadAlloc,
            _ => Self::Null,
        }
    }

    /// The name given to Python.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::OutOfMemoryError => "OutOfMemoryError",
            Self::BadAlloc => "bad_alloc",
            Self::Null => "null",
        }
    }
}

/// Tells the shim which PyTorch is loaded (its `torch.__version__`) and returns how a failure
/// will reach it.
pub(super) fn configure_shim(torch_version: &str) -> ShimMode {
    let bytes = tested_torch(torch_version).map_or(0, |t| t.error_vtable_bytes);
    // SAFETY: the shim's set-up takes a plain integer and only looks up loaded libraries.
    ShimMode::from_code(unsafe { rrmm_torch_shim_configure(bytes) })
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
    let mr = super::shared::HookResource::of_device(device)?;
    // SAFETY: `rrmm_torch_deallocate`'s contract (PyTorch's pluggable allocator): `ptr` came from
    // `rrmm_torch_allocate` with `size` on `device` and `stream`, and is freed once, after its work.
    unsafe { deallocate_on(&mr, device, ptr, size, Stream::from_raw(stream)) }
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

/// The allocation, or None with the failure's message written to `message` as a C string;
/// never unwinds (a panic becomes a message). Kept out of line so that [`rrmm_torch_allocate`]
/// owns nothing to drop.
#[inline(never)]
fn attempt_allocate(
    size: usize,
    device: c_int,
    stream: usize,
    message: &mut [u8; 1024],
) -> Option<usize> {
    match catch_unwind(AssertUnwindSafe(|| allocate(size, device, stream))) {
        Ok(Ok(ptr)) => return Some(ptr),
        Ok(Err(error)) => *message = message_buffer(&error.to_string()),
        Err(_) => *message = message_buffer("rrmm: internal error (panic) in rrmm_torch_allocate"),
    }
    None
}

/// Allocates for PyTorch: `size` bytes on `stream` from the per-device resource of `device`.
/// Size 0 gives the null pointer. Exported from the extension module.
///
/// # Safety
/// Called by PyTorch (or C code) with a `stream` that is a live stream of `device` or a default
/// stream handle. On failure this function throws a C++ exception through the loaded PyTorch's
/// C++ runtime: it must be called from C++ (or through a `"C-unwind"` declaration) that is
/// prepared for one, as PyTorch is. Without a PyTorch runtime in the process it returns null.
#[no_mangle]
pub unsafe extern "C-unwind" fn rrmm_torch_allocate(
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    let mut message = [0u8; 1024];
    if let Some(ptr) = attempt_allocate(size, device, stream as usize, &mut message) {
        return ptr as *mut c_void;
    }
    // SAFETY: `message` is NUL-terminated (at most 1023 bytes of text) and lives in this frame;
    // the shim copies it before throwing. The exception unwinds through this `"C-unwind"` frame,
    // which owns nothing that needs dropping (no landing pad, so no personality routine).
    unsafe { rrmm_torch_raise_out_of_memory(message.as_ptr().cast()) };
    std::ptr::null_mut()
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

/// `torch_shim_configure(torch_version) -> str`: called by the PyTorch hook at set-up with
/// `torch.__version__` (PyTorch loaded): `"OutOfMemoryError"` when out of memory will raise
/// `torch.cuda.OutOfMemoryError` (a tested PyTorch whose layout checks pass), `"bad_alloc"` when
/// it will raise `RuntimeError`, `"null"` when no PyTorch C++ runtime is loaded.
#[pyfunction]
fn torch_shim_configure(torch_version: &str) -> &'static str {
    configure_shim(torch_version).name()
}

/// `torch_tested_versions() -> list[str]`: the `major.minor` releases in [`TESTED_TORCH`].
#[pyfunction]
fn torch_tested_versions() -> Vec<String> {
    TESTED_TORCH
        .iter()
        .map(|t| format!("{}.{}", t.release.0, t.release.1))
        .collect()
}

crate::python::register_items! {
    functions: torch_allocator_symbols, torch_shim_configure, torch_tested_versions,
        torch_allocator_addresses;
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
        fn rrmm_torch_shim_search_also(library: *const c_char);
    }

    /// Without PyTorch, the shim finds the C++ runtime in the test binary's own libstdc++.
    fn use_the_test_runtime() {
        // SAFETY: a static NUL-terminated name; every test sets the same one.
        unsafe { rrmm_torch_shim_search_also(c"libstdc++.so.6".as_ptr()) };
    }

    /// Calls the exported allocator from C++ as PyTorch does: `Ok(ptr)` or `Err(what())`.
    fn call_from_cpp(
        size: usize,
        device: c_int,
        stream: usize,
    ) -> std::result::Result<usize, String> {
        use_the_test_runtime();
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
    fn untested_or_unlike_pytorch_gets_the_bad_alloc_thrown_by_the_found_runtime() {
        use_the_test_runtime();
        // No PyTorch here: whatever the version, c10::OutOfMemoryError is never forged.
        assert_eq!(configure_shim("1.0.0"), ShimMode::BadAlloc);
        assert_eq!(configure_shim("2.11.0+cu130"), ShimMode::BadAlloc);
        set_per_device_resource(906, Arc::new(SimulatedMemoryResource::new(1 << 20))).unwrap();
        let err = call_from_cpp(2 << 20, 906, 0).unwrap_err();
        assert!(
            err.contains("2097152") || err.contains("out of memory"),
            "{err}"
        );
    }

    proptest::proptest! {
        #[test]
        fn tested_versions_are_major_minor_of_a_release(
            major in 0u32..40,
            minor in 0u32..40,
            patch in 0u32..20,
            local in proptest::option::of("[a-z0-9.]{1,12}"),
            pre in proptest::option::of("(a|b|rc|\\.dev|\\.post)[0-9]{1,3}"),
        ) {
            let mut version = format!("{major}.{minor}.{patch}");
            if let Some(pre) = &pre {
                version.push_str(pre);
            }
            if let Some(local) = &local {
                version.push('+');
                version.push_str(local);
            }
            let listed = TESTED_TORCH.iter().find(|t| t.release == (major, minor)).copied();
            let expected = if pre.is_some() { None } else { listed };
            proptest::prop_assert_eq!(tested_torch(&version), expected);
        }
    }

    #[test]
    fn malformed_versions_are_untested() {
        for version in [
            "", "2", "2.11", "2.11.", "v2.11.0", "2.11.0.0", "2.11.x", " 2.11.0",
        ] {
            assert_eq!(tested_torch(version), None, "{version}");
        }
        assert!(tested_torch("2.11.0+cu130").is_some());
    }

    #[test]
    fn message_buffer_is_terminated_and_cut() {
        let long = "x".repeat(5000);
        let buf = message_buffer(&long);
        assert_eq!(buf[1023], 0);
        assert_eq!(message_buffer("a\0b")[..4], *b"a b\0");
    }
}
