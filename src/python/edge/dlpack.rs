//! DLPack for arrays rrmm hands out (`rrmm.share.SharedArray`): the unversioned `dltensor`
//! capsule of DLPack's stable ABI, which `torch.from_dlpack`, `cupy.from_dlpack`,
//! `numpy.from_dlpack` and Numba take. The tensor is the memory itself (no copy), C-contiguous,
//! with its shape and strides owned by the capsule's context, which also holds a reference to
//! the Python object that owns the memory: the memory stays mapped while any consumer holds it.
//!
//! Ownership follows the protocol: an unconsumed capsule frees the tensor in its destructor; a
//! consumer renames the capsule (`used_dltensor`) and calls the tensor's deleter when done.

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_void, CStr};

/// `kDLCPU`.
pub(crate) const DEVICE_CPU: i32 = 1;
/// `kDLCUDA`.
pub(crate) const DEVICE_CUDA: i32 = 2;

const NAME: &CStr = c"dltensor";

#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// What a capsule's tensor owns: its shape and strides, and the memory's owner.
struct Context {
    shape: Vec<i64>,
    strides: Vec<i64>,
    _owner: Py<PyAny>,
}

/// The DLPack type of a NumPy type string (`<f4`, `|u1`, `<c16`, `|b1`...): little-endian or
/// one byte, an integer, float, complex or bool kind; `None` for anything else.
fn dtype_of(typestr: &str) -> Option<DlDataType> {
    let mut chars = typestr.chars();
    let order = chars.next()?;
    let kind = chars.next()?;
    let bytes: u32 = chars.as_str().parse().ok()?;
    let little = matches!(order, '<' | '=') || (order == '|' && bytes == 1);
    let code = match kind {
        'i' => 0,
        'u' => 1,
        'f' => 2,
        'c' => 5,
        'b' => 6,
        _ => return None,
    };
    let bits = u8::try_from(bytes.checked_mul(8)?).ok()?;
    (little && bytes > 0).then_some(DlDataType {
        code,
        bits,
        lanes: 1,
    })
}

/// A `dltensor` capsule over `data` (on `device`: `(device type, ordinal)`), of `typestr`
/// elements in `shape` (C order), holding `owner` until the tensor is let go.
///
/// # Errors
/// `BufferError` for a type DLPack cannot say or a shape past its limits.
pub(crate) fn capsule<'py>(
    py: Python<'py>,
    owner: Py<PyAny>,
    data: usize,
    device: (i32, i32),
    typestr: &str,
    shape: &[u64],
) -> PyResult<Bound<'py, PyAny>> {
    let dtype = dtype_of(typestr).ok_or_else(|| {
        PyBufferError::new_err(format!(
            "{typestr:?}: DLPack takes little-endian integer, float, complex or bool elements \
             (use __cuda_array_interface__ or __array_interface__)"
        ))
    })?;
    let shape: Vec<i64> = shape
        .iter()
        .map(|&n| i64::try_from(n))
        .collect::<Result<_, _>>()
        .map_err(|_| PyBufferError::new_err("a dimension past i64"))?;
    let ndim = i32::try_from(shape.len()).map_err(|_| PyBufferError::new_err("too many dims"))?;
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1].saturating_mul(shape[i + 1].max(1));
    }
    let mut context = Box::new(Context {
        shape,
        strides,
        _owner: owner,
    });
    let tensor = Box::new(DlManagedTensor {
        dl_tensor: DlTensor {
            data: data as *mut c_void,
            device: DlDevice {
                device_type: device.0,
                device_id: device.1,
            },
            ndim,
            dtype,
            shape: context.shape.as_mut_ptr(),
            strides: context.strides.as_mut_ptr(),
            byte_offset: 0,
        },
        manager_ctx: Box::into_raw(context).cast(),
        deleter: Some(delete_tensor),
    });
    let raw = Box::into_raw(tensor);
    // SAFETY: `raw` is a live, boxed DLManagedTensor; the name is a static C string; the
    // destructor below frees the tensor only while the capsule is still unconsumed (named
    // `dltensor`), which is the protocol's rule. With the GIL held (`py`).
    let made = unsafe { ffi::PyCapsule_New(raw.cast(), NAME.as_ptr(), Some(capsule_destructor)) };
    if made.is_null() {
        // SAFETY: the capsule was not made: nothing else knows `raw`; it is freed once, here.
        unsafe { delete_tensor(raw) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `made` is a new, owned reference to a capsule (checked non-null above).
    Ok(unsafe { Bound::from_owned_ptr(py, made) })
}

/// The tensor's deleter (called by a consumer once, or by the destructor of a capsule nobody
/// consumed): frees the tensor and its context, letting go of the memory's owner.
///
/// # Safety
/// `tensor` is null or was made by [`capsule`] and not deleted before.
unsafe extern "C" fn delete_tensor(tensor: *mut DlManagedTensor) {
    if tensor.is_null() {
        return;
    }
    // SAFETY: the caller's precondition: `tensor` came from `Box::into_raw` in `capsule`, and
    // its context from `Box::into_raw` of a `Context`; each is freed here once.
    let context = unsafe {
        let tensor = Box::from_raw(tensor);
        (!tensor.manager_ctx.is_null()).then(|| Box::from_raw(tensor.manager_ctx.cast::<Context>()))
    };
    // The owner is let go at once where Python can be entered (a consumer frees its array with
    // the GIL held); otherwise (interpreter shutting down) PyO3 defers it.
    let mut slot = context;
    let _ = Python::try_attach(|_| drop(slot.take()));
    drop(slot);
}

/// The capsule's destructor: a capsule still named `dltensor` was never consumed, so its tensor
/// is freed here; a consumed one (renamed) belongs to its consumer.
///
/// # Safety
/// Called by Python with a capsule that is being destroyed, with the GIL held.
unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: `capsule` is a live capsule (Python's call); neither call sets an exception for a
    // capsule of that name, and the pointer of one named `dltensor` is the tensor `capsule`
    // made above, not deleted yet (a consumer renames it before deleting).
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, NAME.as_ptr()) == 1 {
            let tensor = ffi::PyCapsule_GetPointer(capsule, NAME.as_ptr());
            delete_tensor(tensor.cast());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_strings_map_to_dlpack_types_or_are_refused() {
        let t = |code, bits| {
            Some(DlDataType {
                code,
                bits,
                lanes: 1,
            })
        };
        assert_eq!(dtype_of("<f4"), t(2, 32));
        assert_eq!(dtype_of("|u1"), t(1, 8));
        assert_eq!(dtype_of("<i8"), t(0, 64));
        assert_eq!(dtype_of("<c16"), t(5, 128));
        assert_eq!(dtype_of("|b1"), t(6, 8));
        assert_eq!(dtype_of("<f2"), t(2, 16));
        for refused in [
            ">f4", "|V8", "<M8", "|O8", "", "<", "<f", "<f0", "<f64", "|S3",
        ] {
            assert_eq!(dtype_of(refused), None, "{refused}");
        }
    }
}
