//! The Python extension module `rrmm._rrmm` (cargo feature `python`): the only code that knows
//! about Python. Each file registers its classes and functions with `register`.

mod adaptors;
mod buffer;
mod cupy_stream;
mod device_buffer;
mod errors;
mod expandable;
mod hooks;
mod memory_stats;
mod replay;
mod resources;
mod stream;
mod torch_alloc;

use pyo3::prelude::*;

/// The extension module.
#[pymodule]
fn _rrmm(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    stream::register(m)?;
    resources::register(m)?;
    adaptors::register(m)?;
    device_buffer::register(m)?;
    replay::register(m)?;
    hooks::register(m)?;
    cupy_stream::register(m)?;
    torch_alloc::register(m)?;
    memory_stats::register(m)?;
    expandable::register(m)?;
    Ok(())
}
