//! The Python extension module `rrmm._rrmm` (cargo feature `python`): the only code that knows
//! about Python. One file per job, mirroring `python/rrmm`; each registers its classes and
//! functions with `register`, and a new binding is a new file plus one line below.
//!
//! Layers (each file imports only from those above it): `errors`, `stream`, `resource` (the
//! base classes), `convert` (arguments), then the resources (`base_resources`,
//! `suballocators`, `statistics`, `adaptors`), `registry`, `device`, `device_buffer`, and the framework hooks
//! (`hooks`, shared by `cupy`, `numba` and `torch`).

mod adaptors;
mod arena;
mod base_resources;
mod callable_ref;
mod convert;
mod cupy;
mod cupy_stream;
mod device;
mod device_buffer;
mod errors;
mod expandable;
mod experimental;
mod gil;
mod gpu;
mod history;
mod hooks;
mod host_buffer;
mod memory_stats;
mod numba;
mod pointers;
mod registry;
mod replay;
mod resource;
mod stack;
mod statistics;
mod stream;
mod suballocators;
mod torch;
mod upstream_kw;

use pyo3::prelude::*;

/// The extension module.
#[pymodule]
fn _rrmm(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    stream::register(m)?;
    resource::register(m)?;
    convert::register(m)?;
    base_resources::register(m)?;
    suballocators::register(m)?;
    statistics::register(m)?;
    adaptors::register(m)?;
    registry::register(m)?;
    device::register(m)?;
    arena::register(m)?;
    device_buffer::register(m)?;
    history::register(m)?;
    replay::register(m)?;
    hooks::register(m)?;
    cupy::register(m)?;
    cupy_stream::register(m)?;
    numba::register(m)?;
    torch::register(m)?;
    experimental::register(m)?;
    gpu::register(m)?;
    memory_stats::register(m)?;
    expandable::register(m)?;
    stack::register(m)?;
    Ok(())
}
