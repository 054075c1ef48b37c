//! Where Python's pointers, buffers and streams meet rrmm's: `rrmm.DeviceBuffer` and the
//! pointer copies (`device_buffer`), host buffers through the buffer protocol (`host_buffer`,
//! `host_bytes`), what rrmm can tell about a raw pointer (`pointers`), and CUDA streams
//! (`stream`).
//!
//! Two files are open to the rest of the bindings: `stream` (`stream=` arguments and stream
//! objects) and `pointers` (where the system resources made from Python are registered); what
//! the files share among themselves is `pub(super)`.

mod device_buffer;
mod host_buffer;
mod host_bytes;
pub(super) mod pointers;
pub(super) mod stream;

use pyo3::prelude::*;

/// Registers the stream, buffer and pointer-copy classes and functions.
pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    register_files!(m, stream, device_buffer, host_bytes)
}
