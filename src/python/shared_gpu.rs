//! `rrmm.shared_gpu` from Python: join a GPU's ledger, declare idle or busy, read the ledger
//! ([`crate::shared_gpu`]). Every function takes the resource whose memory is shared (Python
//! passes the current device resource by default).

use super::errors::py_result;
use super::resources::convert::bytes_arg;
use super::resources::resource::DeviceMemoryResource;
use crate::shared_gpu::entry::{Entry, Event};
use crate::shared_gpu::ledger_dir::Listing;
use crate::shared_gpu::{self, Member, ShareOptions, Size};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyList};
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

/// The options `join` and `reinitialize(share_gpu=...)` take (the keys of the dict).
const OPTIONS: [&str; 5] = [
    "soft_share",
    "hard_limit",
    "name",
    "directory",
    "device_key",
];

/// A share's size: bytes (an int), a byte string (`"10GiB"`, the package's one grammar) or a
/// percentage of the device (`"25%"`); `None` when not given.
fn size_arg(value: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<Size>> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    if value.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "{name} must be bytes (an int), a byte string such as \"10GiB\" or a percentage \
             such as \"25%\", not bool"
        )));
    }
    if let Ok(text) = value.extract::<String>() {
        return Size::parse(&text)
            .map(Some)
            .map_err(|why| PyValueError::new_err(format!("{name}={why}")));
    }
    Ok(Some(Size::Bytes(bytes_arg(value, name)? as u64)))
}

/// A text option (`name`, `device_key`); `None` when not given.
fn text_arg(value: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<String>> {
    match value.filter(|v| !v.is_none()) {
        None => Ok(None),
        Some(v) => v.extract::<String>().map(Some).map_err(|_| {
            PyTypeError::new_err(format!(
                "{name} must be a str, not {}",
                v.get_type().name().map_or("?".into(), |n| n.to_string())
            ))
        }),
    }
}

/// The options of `join` from a dict of them (`join`'s keywords, `reinitialize`'s `share_gpu`;
/// `None`: none given), each checked for its key, type and units; `what` names the dict in the
/// message of an unknown key.
fn options_from(options: Option<&Bound<'_, PyDict>>, what: &str) -> PyResult<ShareOptions> {
    let Some(dict) = options else {
        return Ok(ShareOptions::default());
    };
    for key in dict.keys() {
        let known = key
            .extract::<String>()
            .is_ok_and(|k| OPTIONS.contains(&k.as_str()));
        if !known {
            return Err(PyTypeError::new_err(format!(
                "{what} has an unknown option {} (the options are {})",
                key.repr().map_or("?".into(), |r| r.to_string()),
                OPTIONS.join(", ")
            )));
        }
    }
    let get = |key: &str| dict.get_item(key);
    let directory =
        match get("directory")?.filter(|v| !v.is_none()) {
            None => None,
            Some(d) => Some(d.extract::<std::path::PathBuf>().map_err(|_| {
                PyTypeError::new_err("directory must be a str or an os.PathLike path")
            })?),
        };
    Ok(ShareOptions {
        soft_share: size_arg(get("soft_share")?.as_ref(), "soft_share")?,
        hard_limit: size_arg(get("hard_limit")?.as_ref(), "hard_limit")?,
        name: text_arg(get("name")?.as_ref(), "name")?,
        directory,
        device_key: text_arg(get("device_key")?.as_ref(), "device_key")?,
    })
}

/// `_shared_gpu_join(mr, *, soft_share=None, hard_limit=None, name=None, directory=None,
/// device_key=None) -> str`: joins the ledger of `mr`'s memory; returns its directory. Every
/// option is checked before anything changes.
#[pyfunction]
#[pyo3(signature = (mr, **options))]
fn _shared_gpu_join(
    py: Python<'_>,
    mr: PyRef<'_, DeviceMemoryResource>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<String> {
    let options = options_from(options, "join")?;
    let inner = mr.inner.clone();
    let member = py_result(py.detach(move || shared_gpu::join(&inner, &options)))?;
    Ok(member.directory().display().to_string())
}

/// `_shared_gpu_check_options(options, devices) -> None`: checks `reinitialize`'s
/// `share_gpu` (True, False, None, or a dict of `join`'s options) for each of `devices`
/// without joining or changing anything: the keys, the types, the units, and where the
/// device's size is known (a driver and the device), the sizes against it and against the
/// hard limit (the user's or MPS's).
#[pyfunction]
fn _shared_gpu_check_options(
    py: Python<'_>,
    options: &Bound<'_, PyAny>,
    devices: Vec<usize>,
) -> PyResult<()> {
    let options = if options.is_none() || options.is_instance_of::<PyBool>() {
        if !options.is_truthy()? {
            return Ok(());
        }
        ShareOptions::default()
    } else {
        let dict = options.cast::<PyDict>().map_err(|_| {
            PyTypeError::new_err(format!(
                "share_gpu must be True, False, None or a dict of options, not {}",
                options.repr().map_or("?".into(), |r| r.to_string())
            ))
        })?;
        options_from(Some(dict), "share_gpu")?
    };
    py_result(py.detach(move || {
        if devices.is_empty() {
            return options.check(None, None);
        }
        for ordinal in devices {
            let total = crate::cuda::device_memory_info(ordinal)
                .ok()
                .map(|(_, total)| total as u64);
            options.check(Some(ordinal), total)?;
        }
        Ok(())
    }))
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
    d.set_item("socket", member.socket_path().display().to_string())?;
    d.set_item("pid", std::process::id())?;
    d.set_item("soft_share", member.soft_share())?;
    let (limit, from) = member.hard_limit();
    d.set_item("hard_limit", limit)?;
    d.set_item("hard_limit_from", from)?;
    d.set_item("idle", member.idle())?;
    Ok(Some(d))
}

/// One process of a ledger as `rrmm.shared_gpu.ProcessRow`'s fields; `stale`: its process
/// cannot be seen from here and its entry was not written for a minute (left out of every
/// figure).
fn row<'py>(py: Python<'py>, e: &Entry, stale: bool) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    super::set_fields!(d, e.holder; pid, live, cached, soft_share, hard_limit, idle, asleep);
    super::set_fields!(d, e; pid_ns, started, name, total, hard_limit_from, waiting, updated);
    let history = PyList::empty(py);
    for event in &e.history {
        history.append(event_dict(py, event)?)?;
    }
    d.set_item("history", history)?;
    d.set_item("stale", stale)?;
    Ok(d)
}

/// The rows of a listing: its live processes, then its stale ones.
fn rows<'py>(py: Python<'py>, listing: &Listing) -> PyResult<Bound<'py, PyList>> {
    let rows = PyList::empty(py);
    for e in &listing.entries {
        rows.append(row(py, e, false)?)?;
    }
    for e in &listing.stale {
        rows.append(row(py, e, true)?)?;
    }
    Ok(rows)
}

/// `_shared_gpu_processes(mr) -> (list[dict], list[tuple[str, str]])`: every process of the
/// ledger (its entry; stale ones last, marked) and the files refused, with why.
#[pyfunction]
fn _shared_gpu_processes<'py>(
    py: Python<'py>,
    mr: PyRef<'py, DeviceMemoryResource>,
) -> PyResult<(Bound<'py, PyList>, Refusals)> {
    let member = joined(&mr)?;
    let listing = py.detach(move || member.listing());
    Ok((rows(py, &listing)?, listing.refused))
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
    super::set_fields!(d, r;
        bytes, shortfall, trimmed, slept, claimed, trim_asked, sleep_asked, unanswered, seconds, note,
    );
    Ok(d)
}

/// `_shared_gpu_read(directory, total=None) -> (list[dict], list[tuple[str, str]])`: the
/// processes of a ledger directory (rows as `_shared_gpu_processes`'s) without joining it
/// (`rrmm info`), read and checked as a member reads them, each against `total` (default:
/// its own device size), and nothing removed; a directory that is not this user's alone is
/// one refusal.
#[pyfunction]
#[pyo3(signature = (directory, total=None))]
fn _shared_gpu_read(
    py: Python<'_>,
    directory: std::path::PathBuf,
    total: Option<u64>,
) -> PyResult<(Bound<'_, PyList>, Refusals)> {
    let shown = directory.display().to_string();
    let read = py.detach(move || {
        shared_gpu::ledger_dir::LedgerDir::existing(&directory).map(|dir| dir.read(total))
    });
    match read {
        Ok(listing) => Ok((rows(py, &listing)?, listing.refused)),
        Err(e) => Ok((PyList::empty(py), vec![(shown, e.to_string())])),
    }
}

/// `_shared_gpu_default_directory() -> str`: where ledgers are kept by default.
#[pyfunction]
fn _shared_gpu_default_directory() -> String {
    shared_gpu::ledger_dir::default_base().display().to_string()
}

super::register_items!(functions: _shared_gpu_join, _shared_gpu_check_options,
    _shared_gpu_leave, _shared_gpu_use,
    _shared_gpu_set_idle, _shared_gpu_status, _shared_gpu_processes, _shared_gpu_history,
    _shared_gpu_ask, _shared_gpu_read, _shared_gpu_default_directory;);
