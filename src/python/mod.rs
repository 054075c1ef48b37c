//! The Python extension module `rrmm._rrmm` (cargo feature `python`): the only code that knows
//! about Python. One file per job, mirroring `python/rrmm`; each registers its classes and
//! functions with `register`, and a new binding is a new file plus one line below.
//!
//! Layers (each file imports only from those above it): `errors`, `stream`, `resource` (the
//! base classes), `convert` (arguments), then the resources (`source_resources`,
//! `suballocators`, `statistics`, `adaptors`), `registry`, `device`, `device_buffer`, and the
//! framework hooks (`hooks`, shared by `cupy`, `numba` and `torch`).
//!
//! Folders: `resources/` (the `rrmm.mr` classes, their registry and the stack builder's Python
//! side), `hooks/` (CuPy, Numba, PyTorch and the history they record), `edge/` (where Python's
//! pointers, buffers and streams meet rrmm's: device and host buffers, pointer checks,
//! streams); shared helpers (errors, arguments, the GIL rule) and the module functions at the
//! top. The modules stay one flat namespace (`super::name` reaches any of them).

#[path = "resources/adaptors.rs"]
mod adaptors;
#[path = "resources/arena.rs"]
mod arena;
mod callable_ref;
#[path = "resources/callback.rs"]
mod callback;
mod convert;
#[path = "hooks/cupy.rs"]
mod cupy;
#[path = "hooks/cupy_stream.rs"]
mod cupy_stream;
mod device;
#[path = "edge/device_buffer.rs"]
mod device_buffer;
mod errors;
#[path = "resources/expandable.rs"]
mod expandable;
#[path = "resources/experimental.rs"]
mod experimental;
mod gil;
mod gpu;
#[path = "hooks/history.rs"]
mod history;
#[path = "hooks/hooks.rs"]
mod hooks;
#[path = "edge/host_buffer.rs"]
mod host_buffer;
#[path = "edge/host_bytes.rs"]
mod host_bytes;
#[path = "resources/memory_stats.rs"]
mod memory_stats;
#[path = "hooks/numba.rs"]
mod numba;
#[path = "edge/pointers.rs"]
mod pointers;
#[path = "resources/registry.rs"]
mod registry;
mod replay;
mod replay_allocator;
#[path = "resources/resource.rs"]
mod resource;
#[path = "resources/sleep.rs"]
mod sleep;
#[path = "resources/source_resources.rs"]
mod source_resources;
#[path = "resources/stack.rs"]
mod stack;
#[path = "resources/statistics.rs"]
mod statistics;
#[path = "edge/stream.rs"]
mod stream;
#[path = "resources/suballocators.rs"]
mod suballocators;
#[path = "resources/tiers.rs"]
mod tiers;
#[path = "hooks/torch.rs"]
mod torch;
#[path = "resources/upstream_kw.rs"]
mod upstream_kw;
#[path = "resources/wrap.rs"]
mod wrap;

use pyo3::prelude::*;

/// The extension module.
#[pymodule]
fn _rrmm(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    stream::register(m)?;
    resource::register(m)?;
    convert::register(m)?;
    source_resources::register(m)?;
    callback::register(m)?;
    suballocators::register(m)?;
    statistics::register(m)?;
    adaptors::register(m)?;
    tiers::register(m)?;
    registry::register(m)?;
    device::register(m)?;
    arena::register(m)?;
    device_buffer::register(m)?;
    host_bytes::register(m)?;
    history::register(m)?;
    replay::register(m)?;
    replay_allocator::register(m)?;
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
