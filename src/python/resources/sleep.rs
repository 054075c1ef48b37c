//! Sleep and wake from Python: the bodies of `offload()`, `restore()`, `asleep`, `tag()` and
//! `sleep_estimate()` on every resource (they reach the expandable pool under adaptors, see
//! `crate::suballocator::sleep`), the figures as dicts, and the pointer of a buffer.

use crate::python::errors::py_result;
use crate::resource::host_pages::disk::DiskTarget;
use crate::resource::SharedResource;
use crate::suballocator::sleep as rs;
use crate::suballocator::{DiscardFill, SleepReport, SleepTag};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The device address of `obj`: an int, a PyTorch tensor (`data_ptr()`), an object with
/// `__cuda_array_interface__` (CuPy, Numba, `DeviceBuffer`), or one with an int `ptr`.
pub(super) fn pointer_of(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    if let Ok(ptr) = obj.extract::<usize>() {
        return Ok(ptr);
    }
    if obj.is_instance_of::<pyo3::types::PyInt>() {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "ptr={obj} is not an address (0 <= ptr < 2**64)"
        )));
    }
    if let Ok(data_ptr) = obj.getattr("data_ptr") {
        if data_ptr.is_callable() {
            return data_ptr.call0()?.extract();
        }
    }
    if let Ok(cai) = obj.getattr("__cuda_array_interface__") {
        return cai.get_item("data")?.get_item(0)?.extract();
    }
    if let Ok(ptr) = obj.getattr("ptr") {
        return ptr.extract();
    }
    Err(PyTypeError::new_err(format!(
        "{} is not a device pointer or buffer (an int, a tensor with data_ptr(), or an object \
         with __cuda_array_interface__ or ptr)",
        obj.get_type().name()?
    )))
}

fn parse<T: std::str::FromStr<Err = crate::Error>>(text: &str) -> PyResult<T> {
    py_result(text.parse())
}

use crate::python::record::record_dict;

/// A [`SleepReport`] as a dict: the estimate's fields and the times.
pub(super) fn report_dict<'py>(py: Python<'py>, r: &SleepReport) -> PyResult<Bound<'py, PyDict>> {
    record_dict(py, r)
}

/// The bytes of the buffer `obj` where it says (a `DeviceBuffer`'s `size`, an array's or
/// tensor's `nbytes`); `None` for a pointer alone.
pub(super) fn size_of(obj: &Bound<'_, PyAny>) -> Option<usize> {
    if obj.extract::<usize>().is_ok() {
        return None;
    }
    for name in ["nbytes", "size"] {
        if let Some(n) = obj
            .getattr(name)
            .ok()
            .and_then(|v| v.extract::<usize>().ok())
        {
            if name == "nbytes" || obj.getattr("ptr").is_ok() {
                return Some(n);
            }
        }
    }
    None
}

/// Tags the live allocation holding `obj`'s pointer in whichever expandable pool under `mr`
/// holds it (exactly that allocation's bytes); returns the allocation's start.
pub(super) fn tag(
    py: Python<'_>,
    mr: &SharedResource,
    obj: &Bound<'_, PyAny>,
    tag: &str,
) -> PyResult<usize> {
    let ptr = pointer_of(obj)?;
    let size = size_of(obj);
    let tag: SleepTag = parse(tag)?;
    py_result(py.detach(|| rs::tag(mr, ptr, size, tag)))
}

/// A sleep's `discard` and `discard_fill` read: the buffers not worth copying (pointer and
/// size where known), whether all are ("all"), and the fill; every refusal names the argument.
type Discards = (Vec<(usize, Option<usize>)>, bool, DiscardFill);

fn discard_args(discard: Option<&Bound<'_, PyAny>>, discard_fill: &str) -> PyResult<Discards> {
    let fill: DiscardFill = parse(discard_fill)?;
    let mut wanted = Vec::new();
    let mut discard_all = false;
    match discard.filter(|d| !d.is_none()) {
        Some(d) if d.is_instance_of::<pyo3::types::PyString>() => {
            let text: String = d.extract()?;
            if text != "all" {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "discard must be buffers or \"all\", not the string {text:?}"
                )));
            }
            discard_all = true;
        }
        Some(d) => {
            let items = d.try_iter().map_err(|_| {
                PyTypeError::new_err(format!(
                    "discard must be \"all\" or an iterable of buffers (tensors, arrays, \
                     DeviceBuffer objects or pointers), not {}",
                    super::convert::shown(d)
                ))
            })?;
            for (i, item) in items.enumerate() {
                let item = item?;
                let ptr = pointer_of(&item).map_err(|e| {
                    let py = item.py();
                    let why = e.value(py).to_string();
                    PyErr::from_type(
                        e.get_type(py),
                        format!("discard[{i}]={}: {why}", super::convert::shown(&item)),
                    )
                })?;
                wanted.push((ptr, size_of(&item)));
            }
        }
        None => {}
    }
    Ok((wanted, discard_all, fill))
}

/// `_check_sleep_options(discard, discard_fill)`: `rrmm.sleep()`'s arguments checked where
/// they are given (its offload runs later, when the block is entered), as `offload()` reads
/// them.
#[pyfunction]
#[pyo3(signature = (discard, discard_fill))]
fn _check_sleep_options(discard: Option<&Bound<'_, PyAny>>, discard_fill: &str) -> PyResult<()> {
    discard_args(discard, discard_fill).map(drop)
}

crate::python::register_items! {
    functions: _check_sleep_options;
}

/// `offload()`: offloads every expandable pool under `mr`, not copying `discard`'s buffers
/// (this sleep only). Every buffer is resolved before anything changes: a refused offload
/// changes nothing.
pub(super) fn offload<'py>(
    py: Python<'py>,
    mr: &SharedResource,
    discard: Option<&Bound<'py, PyAny>>,
    discard_fill: &str,
    to_disk: Option<std::path::PathBuf>,
    disk_chunk_bytes: Option<usize>,
) -> PyResult<Bound<'py, PyDict>> {
    let (wanted, discard_all, fill) = discard_args(discard, discard_fill)?;
    let disk = to_disk
        .map(|dir| py_result(DiskTarget::new(dir, disk_chunk_bytes)))
        .transpose()?;
    let estimate = py_result(py.detach(|| {
        let discard = rs::plan_discards(mr, &wanted)?;
        rs::offload_discarding(
            mr,
            rs::SleepPlan {
                discard,
                fill,
                discard_all,
                disk,
                ..rs::SleepPlan::default()
            },
        )
    }))?;
    record_dict(py, &estimate)
}

/// `prepare_sleep()` of every expandable pool under `mr`; with `wait`, until the pages are made.
pub(super) fn prepare(py: Python<'_>, mr: &SharedResource, wait: bool) -> PyResult<usize> {
    py_result(py.detach(|| {
        let bytes = rs::prepare(mr)?;
        if wait {
            crate::resource::host_pages::registered::supply().wait_prepared();
        }
        Ok(bytes)
    }))
}

/// `keep_sleep_ready(on)` of every expandable pool under `mr`.
pub(super) fn keep_ready(py: Python<'_>, mr: &SharedResource, on: bool) -> PyResult<usize> {
    py_result(py.detach(|| rs::keep_ready(mr, on)))
}

/// `restore()` of every sleeping expandable pool under `mr`.
pub(super) fn restore(py: Python<'_>, mr: &SharedResource) -> PyResult<()> {
    py_result(py.detach(|| rs::restore(mr)))
}

/// `sleep_estimate()` summed over the expandable pools under `mr`.
pub(super) fn sleep_estimate<'py>(
    py: Python<'py>,
    mr: &SharedResource,
) -> PyResult<Bound<'py, PyDict>> {
    let estimate = py_result(py.detach(|| rs::sleep_estimate(mr)))?;
    record_dict(py, &estimate)
}

/// `promote(buffer, max_bytes)` of every expandable pool under `mr`: the report as a dict.
pub(super) fn promote<'py>(
    py: Python<'py>,
    mr: &SharedResource,
    buffer: Option<&Bound<'py, PyAny>>,
    limit: Option<usize>,
) -> PyResult<Bound<'py, PyDict>> {
    let range = buffer
        .filter(|b| !b.is_none())
        .map(|b| Ok::<_, PyErr>((pointer_of(b)?, size_of(b).unwrap_or(1))))
        .transpose()?;
    let report = py_result(py.detach(|| rs::promote(mr, range, limit)))?;
    promote_dict(py, &report)
}

/// `at_rest()`: a safe point for every expandable pool under `mr`; the summed report.
pub(super) fn at_rest<'py>(py: Python<'py>, mr: &SharedResource) -> PyResult<Bound<'py, PyDict>> {
    let report = py_result(py.detach(|| rs::promote_at_safe_point(mr)))?;
    promote_dict(py, &report)
}

/// A promotion's report as a dict (`promoted`, `spilled`, `trimmed`, `seconds`, `trim_s`).
pub(crate) fn promote_dict<'py>(
    py: Python<'py>,
    report: &crate::suballocator::sleep::PromoteReport,
) -> PyResult<Bound<'py, PyDict>> {
    record_dict(py, report)
}

/// `spill_figures()` summed over the spilling pools under `mr`, as a dict; None where none
/// spills.
pub(super) fn spill_figures<'py>(
    py: Python<'py>,
    mr: &SharedResource,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    rs::spill_figures(mr)
        .map(|f| record_dict(py, &f))
        .transpose()
}

/// `movement()`: the movement state of each pool under `mr` whose memory moves, as dicts.
pub(super) fn movement<'py>(
    py: Python<'py>,
    mr: &SharedResource,
) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let states: Vec<crate::resource::sleep::Movement> = mr
        .link()
        .sleep
        .pools()
        .iter()
        .map(|p| p.movement())
        .collect();
    states.iter().map(|m| record_dict(py, m)).collect()
}

/// Whether an expandable pool under `mr` is asleep.
pub(super) fn asleep(mr: &SharedResource) -> bool {
    rs::asleep(mr)
}
