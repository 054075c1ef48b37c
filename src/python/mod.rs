//! The Python extension module `rrmm._rrmm` (cargo feature `python`): the only code that knows
//! about Python. One file per job, mirroring `python/rrmm`; each registers its classes and
//! functions with `register`, and a new binding is a new file plus one line in its folder's
//! `register` (or below, for a file at the top).
//!
//! Floors from the ground up, each importing only from those under it: the shared helpers
//! (`errors`, `gil` for the GIL rule, `callable_ref`); `edge/` (where Python's pointers, host
//! buffers and streams meet rrmm's) and `hooks/` (CuPy, Numba, PyTorch and the history they
//! record); `resources/` (the `rrmm.mr` classes, their arguments, their registry and the stack
//! builder's Python side); then `device_buffer` (`rrmm.DeviceBuffer`, with its methods and
//! copies in `device_buffer/`) and the module functions (`device`, `gpu`, `replay`,
//! `replay_allocator`). Each folder is a module that opens only the files the others use.

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
mod device;
mod device_buffer;
mod edge;
mod errors;
mod gil;
mod gpu;
mod hooks;
pub(crate) mod host_pages;
mod python_functions;
pub(crate) mod record;
mod replay;
mod replay_allocator;
mod resources;
mod share;
mod shared_gpu;

use pyo3::prelude::*;

/// The extension module.
#[pymodule]
fn _rrmm(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    register_files!(m, errors, edge, hooks, resources)?;
    register_files!(
        m,
        device_buffer,
        device,
        gpu,
        host_pages,
        record,
        replay,
        replay_allocator,
        share,
        shared_gpu
    )
}

/// A file's `register` function: adds its classes and its `#[pyfunction]`s, in the order given,
/// to the extension module. Most files register only these; the few that add other values
/// (stream constants) write their own.
macro_rules! register_items {
    ($(classes: $($class:ident),+ $(,)?;)? $(functions: $($function:ident),+ $(,)?;)?) => {
        pub(crate) fn register(
            m: &pyo3::Bound<'_, pyo3::types::PyModule>,
        ) -> pyo3::PyResult<()> {
            use pyo3::types::PyModuleMethods as _;
            $($(m.add_class::<$class>()?;)+)?
            $($(m.add_function(pyo3::wrap_pyfunction!($function, m)?)?;)+)?
            Ok(())
        }
    };
}
pub(crate) use register_items;

/// Sets `dict[name] = value.name` for each named field: a record of figures as a Python dict
/// whose keys are the Rust fields' names, written once. Returns early with the error of a
/// failed `set_item`.
macro_rules! set_fields {
    ($dict:expr, $value:expr; $($field:ident),+ $(,)?) => {
        $($dict.set_item(stringify!($field), &$value.$field)?;)+
    };
}
pub(crate) use set_fields;
