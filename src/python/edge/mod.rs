//! Where Python's pointers, buffers and streams meet rrmm's: `rrmm.DeviceBuffer` and the
//! pointer copies (`device_buffer`), host buffers through the buffer protocol (`host_buffer`,
//! `host_bytes`), what rrmm can tell about a raw pointer (`pointers`), and CUDA streams
//! (`stream`).
//!
//! The rest of the bindings take `stream=` arguments and make stream objects through the
//! re-exports below, and register the system resources made from Python with `pointers`.

mod device_buffer;
mod host_buffer;
mod host_bytes;
pub(super) mod pointers;
mod stream;

use pyo3::prelude::*;

pub(super) use stream::{stream_for, StreamArg};

/// Registers the stream, buffer and pointer-copy classes and functions.
pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    stream::register(m)?;
    device_buffer::register(m)?;
    host_bytes::register(m)?;
    Ok(())
}
