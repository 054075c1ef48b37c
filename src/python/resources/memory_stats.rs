//! PyTorch-style figures of rrmm's pools: `_memory_stats`, `_reset_peak_memory_stats` and
//! `_memory_snapshot` (the dicts of `torch.cuda.memory_stats()` and
//! `torch.cuda.memory._snapshot()`); `rrmm.statistics` and `rrmm.memory_snapshot` call them.

use super::resource::DeviceMemoryResource;
use crate::python::errors::figures_readable;
use crate::python::gil;
use crate::report::SegmentInfo;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

/// The PyTorch-keyed counters of the pool behind `mr`, or None when there is no pool.
#[pyfunction]
fn _memory_stats<'py>(
    py: Python<'py>,
    mr: PyRef<'py, DeviceMemoryResource>,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    figures_readable(&*mr.inner)?;
    let inner = mr.inner.clone();
    // The GIL rule (see `gil`): the report takes the resource's lock.
    let stats = gil::call(py, mr.profile(), move || {
        inner.report().and_then(|r| r.memory_stats())
    });
    let Some(stats) = stats else {
        return Ok(None);
    };
    let out = PyDict::new(py);
    for (key, value) in stats.to_pairs() {
        out.set_item(key, value)?;
    }
    Ok(Some(out))
}

/// Sets the peaks of the pool behind `mr` to the current values; whether there was a pool.
#[pyfunction]
fn _reset_peak_memory_stats(py: Python<'_>, mr: PyRef<'_, DeviceMemoryResource>) -> PyResult<bool> {
    figures_readable(&*mr.inner)?;
    let inner = mr.inner.clone();
    Ok(gil::call(py, mr.profile(), move || {
        inner.report().is_some_and(|r| r.reset_peak_memory_stats())
    }))
}

/// The segments of the pool behind `mr` as PyTorch's snapshot dicts (device `device`), or None
/// when there is no pool.
#[pyfunction]
fn _memory_snapshot<'py>(
    py: Python<'py>,
    mr: PyRef<'py, DeviceMemoryResource>,
    device: usize,
) -> PyResult<Option<Bound<'py, PyList>>> {
    figures_readable(&*mr.inner)?;
    let inner = mr.inner.clone();
    let Some(segments) = py.detach(move || inner.report().and_then(|r| r.memory_snapshot())) else {
        return Ok(None);
    };
    let out = PyList::empty(py);
    for segment in &segments {
        out.append(segment_dict(py, segment, device)?)?;
    }
    Ok(Some(out))
}

fn segment_dict<'py>(
    py: Python<'py>,
    s: &SegmentInfo,
    device: usize,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("device", device)?;
    d.set_item("address", s.address)?;
    d.set_item("total_size", s.total_size)?;
    let allocated = s.allocated_size();
    d.set_item("allocated_size", allocated)?;
    d.set_item("active_size", allocated)?;
    d.set_item("requested_size", s.requested_size())?;
    d.set_item("stream", 0)?;
    d.set_item("segment_type", "large")?;
    d.set_item("segment_pool_id", (0, 0))?;
    d.set_item("is_expandable", s.expandable)?;
    // rrmm: the tier that holds the segment, where the resource has tiers (a new key only
    // there, so other snapshots keep PyTorch's keys alone).
    if let Some(tier) = &s.tier {
        d.set_item("tier", tier)?;
    }
    // rrmm: a sleeping pool's segment (no page mapped; its live bytes on the host until
    // `restore()`), only where it is so.
    if s.offloaded {
        d.set_item("offloaded", true)?;
    }
    d.set_item("frames", PyList::empty(py))?;
    let blocks = PyList::empty(py);
    for b in &s.blocks {
        let bd = PyDict::new(py);
        bd.set_item("address", b.address)?;
        bd.set_item("size", b.size)?;
        bd.set_item("requested_size", b.requested_size)?;
        bd.set_item("state", b.state.torch_name())?;
        bd.set_item("frames", PyList::empty(py))?;
        blocks.append(bd)?;
    }
    d.set_item("blocks", blocks)?;
    Ok(d)
}

/// The chain of `mr` with what each resource holds (`rrmm.memory_summary`).
#[pyfunction]
fn _memory_summary(py: Python<'_>, mr: PyRef<'_, DeviceMemoryResource>) -> String {
    let inner = mr.inner.clone();
    py.detach(|| crate::resource::memory_summary::memory_summary(&inner))
}

crate::python::register_items! {
    functions: _memory_summary, _memory_stats, _reset_peak_memory_stats, _memory_snapshot;
}
