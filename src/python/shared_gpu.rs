//! `rrmm.shared_gpu` from Python: join a GPU's ledger, declare idle or busy, read the ledger
//! ([`crate::shared_gpu`]). Every function takes the resource whose memory is shared (Python
//! passes the current device resource by default).

use super::errors::py_result;
use super::resources::convert::bytes_arg;
use super::resources::resource::DeviceMemoryResource;
use crate::shared_gpu::entry::Event;
use crate::shared_gpu::{self, Member, ShareOptions};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::sync::Arc;

/// Files of a ledger's directory that were not read as entries: (file, why).
type Refusals = Vec<(String, String)>;

fn member_of(mr: &DeviceMemoryResource) -> Option<Arc<Member>> {
    shared_gpu::member(mr.inner.link().place)
}

fn joined(mr: &DeviceMemoryResource) -> PyResult<Arc<Member>> {
    member_of(mr).ok_or_else(|| {
        PyRuntimeError::new_err(
            "this process has not joined the GPU's ledger: call rrmm.shared_gpu.join() or \
             rrmm.reinitialize(share_gpu=True), or set RRMM_SHARE_GPU=1",
        )
    })
}

/// A share's size: bytes, a byte string (`"10GiB"`, the package's one grammar) or a
/// percentage of the memory under `mr` (`"25%"`); `None` when not given.
fn share_size(
    py: Python<'_>,
    value: Option<&Bound<'_, PyAny>>,
    name: &str,
    mr: &DeviceMemoryResource,
) -> PyResult<Option<u64>> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    if let Ok(text) = value.extract::<String>() {
        if text.trim().ends_with('%') {
            let inner = mr.inner.clone();
            let total = py.detach(move || inner.memory_info().map(|(_, total)| total));
            let Some(total) = total else {
                return Err(PyValueError::new_err(format!(
                    "{name}={text:?}: the memory under the resource does not report its size"
                )));
            };
            return shared_gpu::parse_size(&text, total as u64)
                .map(Some)
                .ok_or_else(|| {
                    PyValueError::new_err(format!(
                        "{name}={text:?} is not a percentage of the device (0% to 100%)"
                    ))
                });
        }
    }
    Ok(Some(bytes_arg(value, name)? as u64))
}

/// `_shared_gpu_join(mr, soft_share=None, hard_limit=None, name=None, directory=None,
/// device_key=None) -> str`: joins the ledger of `mr`'s memory; returns its directory.
#[pyfunction]
#[pyo3(signature = (mr, soft_share=None, hard_limit=None, name=None, directory=None, device_key=None))]
fn _shared_gpu_join(
    py: Python<'_>,
    mr: PyRef<'_, DeviceMemoryResource>,
    soft_share: Option<&Bound<'_, PyAny>>,
    hard_limit: Option<&Bound<'_, PyAny>>,
    name: Option<String>,
    directory: Option<std::path::PathBuf>,
    device_key: Option<String>,
) -> PyResult<String> {
    let options = ShareOptions {
        soft_share: share_size(py, soft_share, "soft_share", &mr)?,
        hard_limit: share_size(py, hard_limit, "hard_limit", &mr)?,
        name,
        directory,
        device_key,
    };
    let inner = mr.inner.clone();
    let member = py_result(py.detach(move || shared_gpu::join(&inner, &options)))?;
    Ok(member.directory().display().to_string())
}

/// `_shared_gpu_leave(mr) -> bool`: leaves the ledger of `mr`'s memory.
#[pyfunction]
fn _shared_gpu_leave(py: Python<'_>, mr: PyRef<'_, DeviceMemoryResource>) -> bool {
    let place = mr.inner.link().place;
    py.detach(move || shared_gpu::leave(place))
}

/// `_shared_gpu_use(mr) -> bool`: makes `mr` the resource whose pools sleep when asked (the
/// ledger of its memory); whether this process joined that ledger.
#[pyfunction]
fn _shared_gpu_use(mr: PyRef<'_, DeviceMemoryResource>) -> bool {
    match member_of(&mr) {
        Some(m) => {
            m.set_resource(Some(mr.inner.clone()));
            true
        }
        None => false,
    }
}

/// `_shared_gpu_set_idle(mr, idle) -> int`: declares the process idle or busy on the GPU of
/// `mr`; the bytes woken (busy).
#[pyfunction]
fn _shared_gpu_set_idle(
    py: Python<'_>,
    mr: PyRef<'_, DeviceMemoryResource>,
    idle: bool,
) -> PyResult<u64> {
    let member = joined(&mr)?;
    py_result(py.detach(move || member.set_idle(idle)))
}

fn event_dict<'py>(py: Python<'py>, e: &Event) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    super::set_fields!(d, e; at, kind, peer, bytes, given, seconds, note);
    Ok(d)
}

/// `_shared_gpu_status(mr) -> dict | None`: this process's membership (None when it has not
/// joined).
#[pyfunction]
fn _shared_gpu_status<'py>(
    py: Python<'py>,
    mr: PyRef<'py, DeviceMemoryResource>,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    let Some(member) = member_of(&mr) else {
        return Ok(None);
    };
    let d = PyDict::new(py);
    d.set_item("directory", member.directory().display().to_string())?;
    d.set_item("pid", std::process::id())?;
    d.set_item("soft_share", member.soft_share())?;
    let (limit, from) = member.hard_limit();
    d.set_item("hard_limit", limit)?;
    d.set_item("hard_limit_from", from)?;
    d.set_item("idle", member.idle())?;
    Ok(Some(d))
}

/// `_shared_gpu_processes(mr) -> (list[dict], list[tuple[str, str]])`: every live process of
/// the ledger (its entry) and the files refused, with why.
#[pyfunction]
fn _shared_gpu_processes<'py>(
    py: Python<'py>,
    mr: PyRef<'py, DeviceMemoryResource>,
) -> PyResult<(Bound<'py, PyList>, Refusals)> {
    let member = joined(&mr)?;
    let listing = py.detach(move || member.listing());
    let rows = PyList::empty(py);
    for e in &listing.entries {
        let d = PyDict::new(py);
        super::set_fields!(d, e;
            pid, started, name, total, live, cached, soft_share, hard_limit, hard_limit_from,
            idle, asleep, waiting, updated,
        );
        let history = PyList::empty(py);
        for event in &e.history {
            history.append(event_dict(py, event)?)?;
        }
        d.set_item("history", history)?;
        rows.append(d)?;
    }
    Ok((rows, listing.refused))
}

/// `_shared_gpu_history(mr) -> list[dict]`: the events this process recorded, oldest first.
#[pyfunction]
fn _shared_gpu_history<'py>(
    py: Python<'py>,
    mr: PyRef<'py, DeviceMemoryResource>,
) -> PyResult<Bound<'py, PyList>> {
    let member = joined(&mr)?;
    let out = PyList::empty(py);
    for e in member.history() {
        out.append(event_dict(py, &e)?)?;
    }
    Ok(out)
}

/// `_shared_gpu_ask(mr, nbytes) -> dict`: asks the other processes for room for `nbytes` (as
/// an allocation that ran out does); what they answered.
#[pyfunction]
fn _shared_gpu_ask<'py>(
    py: Python<'py>,
    mr: PyRef<'py, DeviceMemoryResource>,
    nbytes: u64,
) -> PyResult<Bound<'py, PyDict>> {
    let member = joined(&mr)?;
    let r = py.detach(move || member.ask_for(nbytes));
    let d = PyDict::new(py);
    super::set_fields!(d, r; bytes, shortfall, trimmed, slept, trim_asked, sleep_asked, seconds, note);
    Ok(d)
}

/// `_shared_gpu_read(directory, total=None) -> (list[str], list[tuple[str, str]])`: the
/// entries (as JSON) of a ledger directory without joining it (`rrmm info`), read and checked
/// as a member reads them, each against `total` (default: its own device size); a directory
/// that is not this user's alone is one refusal.
#[pyfunction]
#[pyo3(signature = (directory, total=None))]
fn _shared_gpu_read(
    py: Python<'_>,
    directory: std::path::PathBuf,
    total: Option<u64>,
) -> (Vec<String>, Refusals) {
    py.detach(
        move || match shared_gpu::ledger_dir::LedgerDir::existing(&directory) {
            Ok(dir) => {
                let listing = dir.list(total);
                let entries = listing
                    .entries
                    .iter()
                    .map(|e| serde_json::to_string(e).unwrap_or_default())
                    .collect();
                (entries, listing.refused)
            }
            Err(e) => (
                Vec::new(),
                vec![(directory.display().to_string(), e.to_string())],
            ),
        },
    )
}

/// `_shared_gpu_default_directory() -> str`: where ledgers are kept by default.
#[pyfunction]
fn _shared_gpu_default_directory() -> String {
    shared_gpu::ledger_dir::default_base().display().to_string()
}

super::register_items!(functions: _shared_gpu_join, _shared_gpu_leave, _shared_gpu_use,
    _shared_gpu_set_idle, _shared_gpu_status, _shared_gpu_processes, _shared_gpu_history,
    _shared_gpu_ask, _shared_gpu_read, _shared_gpu_default_directory;);
