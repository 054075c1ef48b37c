//! Where Python's pointers, host buffers and streams meet rrmm's: host buffers through the
//! buffer protocol (`host_buffer`, `host_bytes`), what rrmm can tell about a raw pointer
//! (`pointers`), and CUDA streams (`stream`). The resources and `DeviceBuffer` stand on it.
//!
//! Three files are open to the rest of the bindings: `stream` (`stream=` arguments and stream
//! objects), `pointers` (raw addresses checked before a copy, and the system resources made from
//! Python that vouch for them) and `host_buffer` (the bytes of a Python host buffer); what the
//! files share among themselves is `pub(super)`.

pub(super) mod host_buffer;
mod host_bytes;
pub(super) mod pointers;
pub(super) mod stream;

use pyo3::prelude::*;

/// Registers the stream and host-bytes classes and the streams' module attributes.
pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    register_files!(m, stream, host_bytes)
}
