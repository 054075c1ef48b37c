//! The `rrmm.mr` classes: the base classes (`resource`), the source resources, the
//! suballocators, the adaptors and their statistics, the Python callback resource, the
//! experimental module, the current resource as Python objects (`registry`), and the stack
//! builder's Python side (`stack`, with `wrap`, which gives a Rust resource its Python class).
//!
//! The rest of the bindings reach the base class and the current resource through the
//! re-exports below; the classes themselves are reached from Python only.

mod adaptors;
mod arena;
mod callback;
mod expandable;
mod experimental;
mod memory_stats;
mod registry;
mod resource;
mod source_resources;
mod stack;
mod statistics;
mod suballocators;
mod upstream_kw;
mod wrap;

use pyo3::prelude::*;

pub(super) use registry::current_resource;
pub(super) use resource::DeviceMemoryResource;

/// Registers the `rrmm.mr` classes and functions.
pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    resource::register(m)?;
    source_resources::register(m)?;
    callback::register(m)?;
    suballocators::register(m)?;
    statistics::register(m)?;
    adaptors::register(m)?;
    registry::register(m)?;
    arena::register(m)?;
    experimental::register(m)?;
    memory_stats::register(m)?;
    expandable::register(m)?;
    stack::register(m)?;
    Ok(())
}
