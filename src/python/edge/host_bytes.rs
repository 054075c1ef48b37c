//! `_HostBytes`, the base class of `rrmm.HostBuffer`: it exports the buffer's bytes through the
//! buffer protocol (the `bf_getbuffer` slot, part of the stable ABI from Python 3.11), so
//! `memoryview(hb)`, `numpy.frombuffer(hb)` and `torch.frombuffer(hb)` work on every supported
//! Python. The FFI edge: the view is filled by `PyBuffer_FillInfo`.

use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use std::ffi::{c_int, c_void};

/// The one byte an empty buffer's view points at (a view of no bytes never reads it).
// Why process-wide: an address that outlives every empty view; never written.
static EMPTY: u8 = 0;

/// Host bytes exported through the buffer protocol: an address and a length, set once by the
/// subclass (`rrmm.HostBuffer`) that owns the memory and frees it when it and every view of it
/// are gone (each view holds a reference to it).
#[pyclass(subclass, module = "rrmm._rrmm", name = "_HostBytes")]
pub(super) struct HostBytes {
    ptr: usize,
    len: usize,
    set: bool,
}

#[pymethods]
impl HostBytes {
    /// Takes the subclass's arguments and ignores them: `HostBuffer.__init__` allocates.
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> Self {
        HostBytes {
            ptr: 0,
            len: 0,
            set: false,
        }
    }

    /// Sets the bytes exported: `size` bytes at `ptr`, owned by the subclass. Once only (a
    /// ValueError after), so no view ever outlives the bytes it was made from.
    fn _set_bytes(&mut self, ptr: usize, size: usize) -> PyResult<()> {
        if self.set {
            return Err(PyValueError::new_err("the buffer's bytes are already set"));
        }
        if size > isize::MAX as usize || (size > 0 && ptr == 0) {
            return Err(PyValueError::new_err(
                "not a buffer: null address or size too large",
            ));
        }
        self.ptr = ptr;
        self.len = size;
        self.set = true;
        Ok(())
    }

    /// The buffer protocol: the bytes, writable, 1-D, format `B`; waits for the copies queued
    /// on the buffer first (the subclass's `synchronize()`).
    ///
    /// # Safety
    /// `view` is the `Py_buffer` the interpreter passes to `bf_getbuffer`.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if slf.hasattr("synchronize")? {
            slf.call_method0("synchronize")?;
        }
        let (ptr, len) = {
            let this = slf.borrow();
            (this.ptr, this.len)
        };
        let buf = if len == 0 {
            std::ptr::addr_of!(EMPTY) as *mut c_void
        } else {
            ptr as *mut c_void
        };
        // SAFETY: `view` is the interpreter's Py_buffer for this call; `buf` is `len` bytes that
        // the subclass owns for as long as the object lives, and the view holds a strong
        // reference to the object (FillInfo increments it), so the bytes outlive the view.
        // A zero length never reads `EMPTY`, and `readonly = 0` is only ever used for it with
        // no bytes to write.
        let rc = unsafe { ffi::PyBuffer_FillInfo(view, slf.as_ptr(), buf, len as isize, 0, flags) };
        if rc != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    /// Releases a view: nothing to do (the view's reference to the object is dropped by the
    /// interpreter).
    ///
    /// # Safety
    /// `_view` is a view this object filled.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<HostBytes>()
}
