//! `rrmm.mr.ArenaMemoryResource`: RMM's arena suballocator over an upstream.

use crate::suballocator::ArenaMemoryResource as RsArena;
use pyo3::prelude::*;

use super::convert::opt_bytes_arg;
use super::resource::{call_blocking, call_locking, UpstreamResourceAdaptor};
use super::suballocators::suballocator_keeping;
use super::upstream_kw::upstream_of;
use crate::python::errors::py_result;

/// A global arena taken from `upstream_mr` once, divided into per-thread and per-stream arenas
/// (RMM's `ArenaMemoryResource`).
#[pyclass(module = "rrmm.mr", name = "ArenaMemoryResource", extends = UpstreamResourceAdaptor, frozen)]
pub(super) struct ArenaMemoryResource {
    pub(super) arena: RsArena,
}

#[pymethods]
impl ArenaMemoryResource {
    #[new]
    #[pyo3(signature = (upstream_mr=None, arena_size=None, dump_log_on_failure=false, *, upstream=None))]
    fn new(
        py: Python<'_>,
        upstream_mr: Option<&Bound<'_, PyAny>>,
        arena_size: Option<&Bound<'_, PyAny>>,
        dump_log_on_failure: bool,
        upstream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let (up, shared) = upstream_of(upstream_mr, upstream)?;
        let size = opt_bytes_arg(arena_size, "arena_size")?;
        let arena = py_result(py.detach(|| RsArena::new(shared, size, dump_log_on_failure)))?;
        Ok(suballocator_keeping(up, arena, |arena| {
            ArenaMemoryResource { arena }
        }))
    }

    /// rrmm: the global arena's size in bytes.
    fn arena_size(&self) -> usize {
        self.arena.arena_size()
    }

    /// rrmm: free bytes (global arena and superblocks).
    fn free_bytes(slf: &Bound<'_, Self>) -> usize {
        let arena = &slf.get().arena;
        call_locking(slf, || arena.free_bytes())
    }

    /// rrmm: synchronizes and returns every empty superblock to the global arena.
    fn defragment(slf: &Bound<'_, Self>) -> PyResult<()> {
        // It synchronizes: a blocking call.
        let arena = &slf.get().arena;
        call_blocking(slf, || arena.defragment())
    }

    /// rrmm: the arena's state as the out-of-memory dump writes it.
    fn state_report(slf: &Bound<'_, Self>) -> String {
        let arena = &slf.get().arena;
        call_locking(slf, || arena.state_report())
    }
}

/// Registers the class.
pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ArenaMemoryResource>()
}
