//! The framework hooks: CuPy's allocator (`cupy`, with CuPy's current stream in
//! `cupy_stream`), Numba's (`numba`), PyTorch's pluggable allocator (`torch_pluggable`), what the three
//! share (`shared`), and the allocation history they and `DeviceBuffer` record (`history`).
//!
//! Two files are open to the rest of the bindings: `history` (which `DeviceBuffer` records
//! into) and `shared` (the count of live hook allocations from chains that run foreign code,
//! which the callback resource checks before it lets go of its functions); what the files share
//! among themselves is `pub(super)`.

mod cupy;
mod cupy_stream;
pub(super) mod history;
mod numba;
pub(super) mod shared;
mod torch_pluggable;

use pyo3::prelude::*;

/// Registers the hooks' functions and classes and the history's functions.
pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    register_files!(
        m,
        history,
        shared,
        cupy,
        cupy_stream,
        numba,
        torch_pluggable
    )
}
