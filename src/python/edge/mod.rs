//! Where Python's pointers, host buffers and streams meet rrmm's: host buffers through the
//! buffer protocol (`host_buffer`, `host_bytes`), what rrmm can tell about a raw pointer
//! (`pointers`), CUDA streams (`stream`), and DLPack tensors over memory rrmm hands out
//! (`dlpack`). The resources and `DeviceBuffer` stand on it.
//!
//! Four files are open to the rest of the bindings: `stream` (`stream=` arguments and stream
//! objects), `pointers` (raw addresses checked before a copy, and the system resources made from
//! Python that vouch for them), `host_buffer` (the bytes of a Python host buffer) and `dlpack`
//! (`rrmm.share.SharedArray.__dlpack__`); what the
//! files share among themselves is `pub(super)`.

pub(super) mod dlpack;
pub(super) mod host_buffer;
mod host_bytes;
pub(super) mod pointers;
pub(super) mod stream;

use pyo3::prelude::*;

/// Registers the stream and host-bytes classes and the streams' module attributes.
pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    register_files!(m, stream, host_bytes)
}
