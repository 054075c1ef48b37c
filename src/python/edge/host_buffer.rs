//! Host buffers through the buffer protocol (`PyObject_GetBuffer`), which the limited API of
//! Python 3.9 lacks in PyO3: declared here, at the FFI edge. The symbols are exported by every
//! CPython 3 and the `Py_buffer` layout has not changed since Python 3.3.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use std::ffi::{c_char, c_int, c_void, CStr};

#[repr(C)]
struct RawPyBuffer {
    buf: *mut c_void,
    obj: *mut pyo3::ffi::PyObject,
    len: isize,
    itemsize: isize,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut isize,
    strides: *mut isize,
    suboffsets: *mut isize,
    internal: *mut c_void,
}

extern "C" {
    fn PyObject_GetBuffer(
        obj: *mut pyo3::ffi::PyObject,
        view: *mut RawPyBuffer,
        flags: c_int,
    ) -> c_int;
    fn PyBuffer_Release(view: *mut RawPyBuffer);
}

const PYBUF_RECORDS_RO: c_int = 0x0004 | 0x0008 | 0x0010;

/// A 1-D, C-contiguous byte buffer of a Python object, held (and the object kept alive) until
/// drop. Checks what RMM's `const unsigned char[::1]` arguments check.
pub(crate) struct HostBuffer {
    view: Box<RawPyBuffer>,
}

// The view pins the exporter's memory; the address is only used while the holder lives, and
// releasing needs the GIL, which `Drop` takes.
// SAFETY: no thread-affine state: `Py_buffer` is plain data plus a strong reference that is
// released with the GIL held.
unsafe impl Send for HostBuffer {}

impl HostBuffer {
    /// Gets the buffer of `obj` (writable when `writable`): a TypeError when `obj` has no buffer,
    /// a ValueError when it is not 1-D contiguous unsigned bytes or is read-only but must be
    /// written.
    pub(crate) fn get(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<Self> {
        let mut view = Box::new(RawPyBuffer {
            buf: std::ptr::null_mut(),
            obj: std::ptr::null_mut(),
            len: 0,
            itemsize: 0,
            readonly: 0,
            ndim: 0,
            format: std::ptr::null_mut(),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            suboffsets: std::ptr::null_mut(),
            internal: std::ptr::null_mut(),
        });
        // SAFETY: `obj` is a live object (we hold the GIL) and `view` a valid, writable
        // Py_buffer; on success the view holds a reference that `Drop` releases.
        let rc = unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut *view, PYBUF_RECORDS_RO) };
        if rc != 0 {
            let err = PyErr::take(obj.py())
                .unwrap_or_else(|| PyTypeError::new_err("a bytes-like object is required"));
            if err.is_instance_of::<pyo3::exceptions::PyBufferError>(obj.py()) {
                return Err(PyTypeError::new_err(format!(
                    "a contiguous bytes-like object is required, not '{}'",
                    obj.get_type().name()?
                )));
            }
            return Err(err);
        }
        let held = HostBuffer { view };
        held.check(writable)?;
        Ok(held)
    }

    fn check(&self, writable: bool) -> PyResult<()> {
        let v = &*self.view;
        let format = if v.format.is_null() {
            "B".to_string()
        } else {
            // SAFETY: the exporter gives a NUL-terminated format string valid while the view is.
            unsafe { CStr::from_ptr(v.format) }
                .to_string_lossy()
                .into_owned()
        };
        let code = format.trim_start_matches(['@', '=', '<', '>', '!']);
        // Any 8-bit type: unsigned and signed bytes, chars and bools (RMM's user guide copies
        // an int8 view of an array).
        if v.itemsize != 1 || !matches!(code, "B" | "c" | "b" | "?") {
            return Err(PyValueError::new_err(format!(
                "Buffer dtype mismatch, expected 'unsigned char' but got '{format}'"
            )));
        }
        if v.ndim != 1 {
            return Err(PyValueError::new_err(format!(
                "Buffer has wrong number of dimensions (expected 1, got {})",
                v.ndim
            )));
        }
        if !v.strides.is_null() {
            // SAFETY: with ndim == 1 the exporter gives one stride.
            let stride = unsafe { *v.strides };
            if stride != 1 && v.len > 1 {
                return Err(PyValueError::new_err(
                    "ndarray is not C-contiguous (a 1-D contiguous uint8 buffer is required)",
                ));
            }
        }
        if writable && v.readonly != 0 {
            return Err(PyValueError::new_err("buffer source array is read-only"));
        }
        Ok(())
    }

    /// The address of the first byte.
    pub(crate) fn addr(&self) -> usize {
        self.view.buf as usize
    }

    /// The length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.view.len.max(0) as usize
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        Python::attach(|_py| {
            // SAFETY: the view was filled by a successful `PyObject_GetBuffer` and is released
            // once, with the GIL held.
            unsafe { PyBuffer_Release(&mut *self.view) }
        });
    }
}
