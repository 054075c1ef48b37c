//! Turning a `CUresult` into rrmm's [`Error`].

use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::ffi::CStr;

/// Converts the result of the driver call `call` into a `Result`.
#[inline]
pub(crate) fn check(call: &'static str, result: sys::CUresult) -> Result<()> {
    if result == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(cuda_error(call, result))
    }
}

/// Builds the error for a failed driver call, with the driver's name and description of it.
#[cold]
pub(crate) fn cuda_error(call: &'static str, result: sys::CUresult) -> Error {
    let mut name_ptr: *const std::ffi::c_char = std::ptr::null();
    let mut desc_ptr: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: both out-pointers are valid; the driver writes static strings or leaves them null.
    unsafe {
        sys::cuGetErrorName(result, &mut name_ptr);
        sys::cuGetErrorString(result, &mut desc_ptr);
    }
    let text = |p: *const std::ffi::c_char| {
        if p.is_null() {
            String::from("unknown")
        } else {
            // SAFETY: the driver returned a pointer to a NUL-terminated static string.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    Error::Cuda {
        call,
        code: result as i32,
        name: text(name_ptr),
        description: text(desc_ptr),
    }
}

/// Maps an allocation failure to [`Error::OutOfMemory`] when CUDA says it is one.
pub(crate) fn check_alloc(call: &'static str, result: sys::CUresult, bytes: usize) -> Result<()> {
    match result {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => Err(Error::out_of_memory(
            bytes,
            format!("CUDA error at {call}: CUDA_ERROR_OUT_OF_MEMORY out of memory"),
        )),
        other => Err(cuda_error(call, other)),
    }
}
