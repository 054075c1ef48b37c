//! The `rrmm.mr` classes: the base classes (`resource`), their arguments (`convert`), the
//! source resources, the suballocators, the adaptors and their statistics, the Python callback resource, the
//! experimental module, the current resource as Python objects (`registry`), and the stack
//! builder's Python side (`stack`, with `wrap`, which gives a Rust resource its Python class).
//!
//! Two files are open to the rest of the bindings: `resource` (the base class every argument
//! that takes a resource names) and `registry` (the current resource, which `DeviceBuffer`
//! allocates from); the classes themselves are reached from Python only, and what the files
//! share among themselves is `pub(super)`.

mod adaptors;
mod arena;
mod callback;
pub(super) mod convert;
mod expandable;
mod experimental;
mod memory_stats;
pub(super) mod registry;
pub(super) mod resource;
mod sleep;
mod source_resources;
mod stack;
pub(super) mod stack_options;
mod statistics;
mod suballocators;
mod tagged;
mod tiers;
mod upstream_kw;
mod wrap;

use pyo3::prelude::*;

/// Registers the `rrmm.mr` classes and functions.
pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    register_files!(
        m,
        resource,
        convert,
        source_resources,
        callback,
        suballocators
    )?;
    register_files!(m, statistics, adaptors, tagged, tiers, registry, arena)?;
    register_files!(m, experimental, memory_stats, expandable, stack, sleep)
}
