//! `rrmm.mr.TaggedMemoryResource`: allocation by tag, each tag an expandable pool of its own
//! that sleeps and wakes on its own (the engines' sleep APIs, `rrmm.compat`, are built on it).

use super::expandable::ExpandableMemoryResource;
use super::resource::{over_upstream, DeviceMemoryResource, UpstreamResourceAdaptor};
use crate::adaptor::TaggedMemoryResource as RsTagged;
use crate::python::errors::py_result;
use parking_lot::Mutex;
use pyo3::exceptions::{PyKeyError, PyTypeError};
use pyo3::prelude::*;
use std::sync::Arc;

/// Allocation by tag: an allocation goes to the expandable pool of the calling thread's
/// current tag (`set_current_tag`; the first tag's, `upstream_mr`, when none is set), a free
/// to the pool that holds the pointer, wherever it is freed. Each tag's pool (`pool(name)`)
/// sleeps and wakes on its own (`pool("kv_cache").offload(discard="all")` drops a KV cache and
/// keeps the weights on the device); `offload()` of this resource sleeps every tag.
#[pyclass(module = "rrmm.mr", name = "TaggedMemoryResource", extends = UpstreamResourceAdaptor, frozen)]
pub(super) struct TaggedMemoryResource {
    tagged: RsTagged,
    /// The tags' pools as Python objects, in order (the first is `upstream_mr`).
    pools: Mutex<Vec<(String, Py<DeviceMemoryResource>)>>,
}

/// The Rust pool of `obj`, an `ExpandableMemoryResource`.
fn expandable_of(
    obj: &Bound<'_, PyAny>,
    what: &str,
) -> PyResult<crate::suballocator::ExpandableMemoryResource> {
    let pool = obj.cast::<ExpandableMemoryResource>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{what} must be an rrmm.mr.ExpandableMemoryResource (a tag's pool sleeps on its \
             own), not {}",
            obj.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })?;
    Ok(pool.get().mr.clone())
}

#[pymethods]
impl TaggedMemoryResource {
    #[new]
    #[pyo3(signature = (upstream_mr, name = "default"))]
    fn new(upstream_mr: &Bound<'_, PyAny>, name: &str) -> PyResult<PyClassInitializer<Self>> {
        let pool = expandable_of(upstream_mr, "upstream_mr")?;
        let tagged = RsTagged::new(name, pool);
        let up: Py<DeviceMemoryResource> =
            upstream_mr.cast::<DeviceMemoryResource>()?.clone().unbind();
        let pools = Mutex::new(vec![(name.to_string(), up.clone_ref(upstream_mr.py()))]);
        Ok(over_upstream(
            TaggedMemoryResource {
                tagged: tagged.clone(),
                pools,
            },
            up,
            Arc::new(tagged),
        ))
    }

    /// Adds tag `name`, allocating from `pool` (an `ExpandableMemoryResource` no tag uses).
    fn add_tag(&self, name: &str, pool: &Bound<'_, PyAny>) -> PyResult<()> {
        let rs = expandable_of(pool, "pool")?;
        py_result(self.tagged.add_tag(name, rs))?;
        let obj = pool.cast::<DeviceMemoryResource>()?.clone().unbind();
        self.pools.lock().push((name.to_string(), obj));
        Ok(())
    }

    /// The pool of tag `name` (KeyError when it is no tag).
    fn pool(&self, py: Python<'_>, name: &str) -> PyResult<Py<DeviceMemoryResource>> {
        self.pools
            .lock()
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| p.clone_ref(py))
            .ok_or_else(|| PyKeyError::new_err(format!("{name:?} is not a tag")))
    }

    /// The tags, in the order they were added.
    #[getter]
    fn tags(&self) -> Vec<String> {
        self.tagged.tags()
    }

    /// Makes `name` the calling thread's current tag (None: no tag); returns the previous one.
    /// ValueError for a name that is no tag.
    fn set_current_tag(&self, name: Option<&str>) -> PyResult<Option<String>> {
        py_result(self.tagged.set_current_tag(name))
    }

    /// The calling thread's current tag (None: none set).
    #[getter]
    fn current_tag(&self) -> Option<String> {
        self.tagged.current_tag()
    }

    /// The garbage collector's view of the pools this object holds.
    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        if let Some(pools) = self.pools.try_lock() {
            for (_, p) in pools.iter() {
                visit.call(p)?;
            }
        }
        Ok(())
    }
}

crate::python::register_items!(classes: TaggedMemoryResource;);
