//! `rrmm.host_pages`: the process's one supply of host pages
//! ([`HostPageSupply`](crate::resource::host_pages::registered::HostPageSupply)) from Python: make pages
//! ready ahead of need, bound what is kept, give it back, read its figures.

use super::errors::py_result;
use crate::resource::host_pages::registered::{supply, PageKind, PageSpec};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The spec of pages of `kind` ("pinned" or "plain") near `device`.
fn spec(kind: &str, device: Option<usize>) -> PyResult<PageSpec> {
    match kind {
        "pinned" => {
            let device = match device {
                Some(d) => d,
                None => py_result(crate::cuda::current_device())?,
            };
            Ok(PageSpec::pinned_for(device))
        }
        "plain" => Ok(PageSpec::plain()),
        other => Err(PyValueError::new_err(format!(
            "kind must be \"pinned\" or \"plain\", not {other:?}"
        ))),
    }
}

/// `host_pages_prepare(nbytes, kind="pinned", device=None, wait=False)`: makes a range of
/// `nbytes` ready ahead of need, on a thread of its own (`wait`: returns once it is made).
#[pyfunction]
#[pyo3(signature = (nbytes, kind = "pinned", device = None, wait = false))]
fn host_pages_prepare(
    py: Python<'_>,
    nbytes: usize,
    kind: &str,
    device: Option<usize>,
    wait: bool,
) -> PyResult<()> {
    let spec = spec(kind, device)?;
    if spec.kind == PageKind::Pinned {
        py_result(crate::cuda::ensure_driver())?;
    }
    py.detach(|| {
        supply().prepare(spec, nbytes);
        if wait {
            supply().wait_prepared();
        }
    });
    Ok(())
}

/// `host_pages_wait()`: waits until no range is being made in the background.
#[pyfunction]
fn host_pages_wait(py: Python<'_>) {
    py.detach(|| supply().wait_prepared());
}

/// `host_pages_give_back(keep=0) -> int`: gives free ranges back to the OS until at most `keep`
/// bytes stay free; returns the bytes given back.
#[pyfunction]
#[pyo3(signature = (keep = 0))]
fn host_pages_give_back(py: Python<'_>, keep: usize) -> usize {
    py.detach(|| supply().give_back(keep))
}

/// `host_pages_set_keep_limit(nbytes)`: the most bytes kept free between uses (None: the
/// default, the largest range handed out so far).
#[pyfunction]
fn host_pages_set_keep_limit(py: Python<'_>, nbytes: Option<usize>) {
    py.detach(|| supply().set_keep_limit(nbytes));
}

/// `host_pages_figures() -> dict`: what the supply holds and has done.
#[pyfunction]
fn host_pages_figures(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    super::record::record_dict(py, &supply().figures())
}

/// `host_pages_room()`: bytes of host memory the process may still use now (MemAvailable,
/// capped by its control groups' limits); 0 where unknown.
#[pyfunction]
pub(crate) fn host_pages_room() -> usize {
    crate::os::host_pages::available_host_memory().map_or(0, |room| room.available)
}

/// `_host_pages_set_room_cap(nbytes)`: caps the host memory every check of the host's room finds
/// available (None: the host's own figure). For tests of what runs out of host memory.
#[pyfunction]
fn _host_pages_set_room_cap(nbytes: Option<usize>) {
    crate::os::host_pages::set_room_cap(nbytes);
}

super::register_items!(functions: host_pages_prepare, host_pages_wait, host_pages_give_back,
    host_pages_set_keep_limit, host_pages_figures, host_pages_room, _host_pages_set_room_cap;);
