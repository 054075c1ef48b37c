//! The Python extension module `rrmm._rrmm` (cargo feature `python`): the only code that knows
//! about Python. One file per job, mirroring `python/rrmm`; each registers its classes and
//! functions with `register`, and a new binding is a new file plus one line in its folder's
//! `register` (or below, for a file at the top).
//!
//! Folders, each a module that re-exports only what the others use: `resources/` (the
//! `rrmm.mr` classes, their registry and the stack builder's Python side), `hooks/` (CuPy,
//! Numba, PyTorch and the history they record), `edge/` (where Python's pointers, buffers and
//! streams meet rrmm's: device and host buffers, pointer checks, streams). At the top: the
//! shared helpers (`errors`, `convert` for arguments, `gil` for the GIL rule, `callable_ref`)
//! and the module functions (`device`, `gpu`, `replay`).

/// The body of a `register` that registers files' classes and functions with the module `m`,
/// in order: `register_files!(m, errors, edge)` calls `errors::register(m)`, then
/// `edge::register(m)`.
macro_rules! register_files {
    ($m:expr, $($file:ident),+ $(,)?) => {{
        $($file::register($m)?;)+
        PyResult::Ok(())
    }};
}

mod callable_ref;
mod convert;
mod device;
mod edge;
mod errors;
mod gil;
mod gpu;
mod hooks;
mod replay;
mod resources;

use pyo3::prelude::*;

/// The extension module.
#[pymodule]
fn _rrmm(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    register_files!(m, errors, edge, resources, convert, device, replay, hooks, gpu)
}
