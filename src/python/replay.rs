//! `rrmm._rrmm.replay_logs`, `fit_logs` and helpers: the engine of `python -m rrmm replay` (over
//! allocators written in Python: `replay_allocator`).

use super::errors::py_result;
use super::resources::convert::{arg, shown, whole_arg};
use super::resources::stack_options::stack_options;
use crate::replay::{
    compare_with_progress, fit_many_with_progress, resource_names, search_smallest,
    CompareSettings, Repeat, ReplayOptions,
};
use crate::stack::{plan, StackOptions, Target, KINDS};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

/// `value` (records of the crate) as Python data: through JSON, so the keys are the Rust
/// records' field names, declared once (`ReplayRecord`, `FitRecord`; their TypedDicts in
/// `_rrmm.pyi`).
pub(super) fn to_python_any<'py, T: serde::Serialize>(
    py: Python<'py>,
    value: &T,
) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(value)
        .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
    py.import("json")?.call_method1("loads", (text,))
}

/// A list of records as Python data ([`to_python_any`]).
fn to_python<'py, T: serde::Serialize>(py: Python<'py>, value: &T) -> PyResult<Bound<'py, PyList>> {
    Ok(to_python_any(py, value)?.cast_into::<PyList>()?)
}

/// Replays each RMM-format log against each named resource and returns one dict per
/// (log, resource), in that order. Runs without the GIL.
///
/// `simulate`: bytes of simulated device memory (an int or a size string; smaller than the
/// log's largest request is a ValueError), or None for the real GPU. `repeat`: timed
/// repetitions after the figures pass on the same resource (None: at least 5 and 0.5 s; at
/// least 1); `timed=False`: the figures pass alone, no timed repetition (then `repeat` is not
/// given). `progress`: None, or a function called with `(events done, events in
/// all, seconds, timed repetitions done)` while a long replay runs (the GIL taken for the call;
/// the command line's one bar draws it). A resource that cannot be built or fails with an error
/// other than out of memory gives a dict with `error` set. Raises ValueError for bad input
/// (naming file and line) or an unknown resource, OSError for an unreadable file, and what
/// `progress` raised.
#[pyfunction]
#[pyo3(signature = (logs, resources, simulate=None, lenient=false, timeline_points=0, progress=None, repeat=None, timed=true, **options))]
#[allow(clippy::too_many_arguments)]
fn replay_logs<'py>(
    py: Python<'py>,
    logs: Vec<String>,
    resources: Vec<String>,
    #[pyo3(from_py_with = arg::simulate)] simulate: Option<usize>,
    lenient: bool,
    timeline_points: usize,
    progress: Option<Py<PyAny>>,
    repeat: Option<&Bound<'py, PyAny>>,
    timed: bool,
    options: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyList>> {
    check_names(&resources)?;
    let repeat = repeat_of(repeat, timed)?;
    let options = stack_options(options)?;
    check_plans(&resources, Target::from_simulate(simulate), &options)?;
    let settings = CompareSettings {
        simulate,
        options,
        replay: ReplayOptions {
            timeline_points,
            repeat,
            ..ReplayOptions::default()
        },
        lenient,
    };
    let progress = progress.filter(|p| !p.is_none(py));
    let mut raised: Option<PyErr> = None;
    let records = py.detach(|| {
        compare_with_progress(&logs, &resources, &settings, &mut |p| {
            let Some(show) = progress.as_ref() else {
                return;
            };
            if raised.is_some() {
                return;
            }
            Python::attach(|py| {
                let args = (p.done, p.total, p.elapsed.as_secs_f64(), p.repetitions);
                if let Err(e) = show.call1(py, args) {
                    raised = Some(e);
                }
            });
        })
    });
    if let Some(e) = raised {
        return Err(e);
    }
    to_python(py, &py_result(records)?)
}

fn check_names(resources: &[String]) -> PyResult<()> {
    let known = resource_names();
    for name in resources {
        let canonical = crate::replay::canonical_name(name);
        if !known.contains(&canonical.as_str()) {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "unknown resource {name:?}; known: {}",
                known.join(", ")
            )));
        }
    }
    Ok(())
}

/// Each resource's plan on `target` with `options` ([`plan`]): an option that no resource of
/// that kind could be built with (RMM's pool size rules, an arena below a superblock, a size of
/// simulated memory) is refused at the call, naming it, before any log is read. What only
/// building finds (out of memory, no driver, no peer link) stays the row's own error.
fn check_plans(resources: &[String], target: Target, options: &StackOptions) -> PyResult<()> {
    for name in resources {
        if let Err(e @ (crate::Error::InvalidArgument { .. } | crate::Error::Logic(_))) =
            plan(name, target, options)
        {
            return py_result(Err(e));
        }
    }
    Ok(())
}

/// The replay's `repeat` and `timed` as Python gives them: `timed=False` the figures pass
/// alone (no `repeat` then); else `repeat` None automatic, or that many timed repetitions (at
/// least 1). Every refusal names the argument, the value and the fix.
pub(super) fn repeat_of(repeat: Option<&Bound<'_, PyAny>>, timed: bool) -> PyResult<Repeat> {
    let repeat = repeat.filter(|r| !r.is_none());
    if !timed {
        return match repeat {
            None => Ok(Repeat::FiguresOnly),
            Some(r) => Err(PyValueError::new_err(format!(
                "repeat={r} with timed=False: the figures pass alone has no timed repetition; \
                 leave repeat out (or None), or pass timed=True"
            ))),
        };
    }
    let Some(repeat) = repeat else {
        return Ok(Repeat::Auto);
    };
    if repeat.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "repeat must be a whole number of timed repetitions or None, not {}",
            shown(repeat)
        )));
    }
    let too_few = || {
        PyValueError::new_err(format!(
            "repeat={repeat}: the timings need at least 1 timed repetition (None: at least 5 \
             and 0.5 s of them); for the figures pass alone, pass timed=False"
        ))
    };
    match whole_arg(repeat, "repeat", "a number of timed repetitions") {
        Ok(0) => Err(too_few()),
        Ok(n) => Ok(Repeat::Times(n)),
        Err(_) if repeat.lt(0).unwrap_or(false) => Err(too_few()),
        Err(e) => Err(e),
    }
}

/// `fit_search(fits, peak, cap) -> (smallest, failing, tries)`: the engine's `--fit` search
/// over sizes up to `cap`, calling `fits(size) -> bool` (for limits that only Python can set: a
/// framework's memory limit). `smallest` is None when not even `cap` fits. An exception raised
/// by `fits` ends the search and propagates.
#[pyfunction]
fn fit_search(
    fits: &Bound<'_, PyAny>,
    peak: usize,
    cap: usize,
) -> PyResult<(Option<usize>, usize, usize)> {
    let mut raised: Option<PyErr> = None;
    let search = search_smallest(peak, cap, |size| {
        match fits.call1((size,)).and_then(|r| r.is_truthy()) {
            Ok(ok) => Ok(ok.then_some(())),
            Err(e) => {
                raised = Some(e);
                Err(crate::Error::Logic("fit_search: fits raised".into()))
            }
        }
    });
    match (search, raised) {
        (_, Some(e)) => Err(e),
        (Ok(s), None) => Ok((s.smallest, s.failing, s.tries)),
        (Err(e), None) => py_result(Err(e)),
    }
}

/// For each log and each named resource, the smallest simulated device on which the log replays
/// with no failed allocation (`--fit`): one dict per (log, resource) with `device_bytes` (None
/// when it fits nowhere, with `reason`), `failing_bytes`, the pool sizes and setup on the device
/// found. Runs without the GIL.
/// `progress(tries, device_bytes, fits)`, where given, is called (with the GIL taken for the
/// call) after every size a search tried; what it raises is raised.
#[pyfunction]
#[pyo3(signature = (logs, resources, lenient=false, progress=None, **options))]
fn fit_logs<'py>(
    py: Python<'py>,
    logs: Vec<String>,
    resources: Vec<String>,
    lenient: bool,
    progress: Option<Py<PyAny>>,
    options: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyList>> {
    check_names(&resources)?;
    let options = stack_options(options)?;
    // Options do not depend on the device's size: checked on one of 1 GiB.
    check_plans(&resources, Target::Simulated(1 << 30), &options)?;
    let progress = progress.filter(|p| !p.is_none(py));
    let mut raised: Option<PyErr> = None;
    let records = py.detach(|| {
        fit_many_with_progress(&logs, &resources, &options, lenient, &mut |t| {
            let (Some(show), None) = (progress.as_ref(), raised.as_ref()) else {
                return;
            };
            Python::attach(|py| {
                if let Err(e) = show.call1(py, (t.tries, t.device_bytes, t.fits)) {
                    raised = Some(e);
                }
            });
        })
    });
    if let Some(e) = raised {
        return Err(e);
    }
    to_python(py, &py_result(records)?)
}

/// The resource names `replay_logs` accepts.
#[pyfunction]
fn replay_resource_names() -> Vec<&'static str> {
    resource_names()
}

/// (name, one-line summary) of every resource `replay_logs` accepts, for `--help`.
#[pyfunction]
fn replay_resource_summaries() -> Vec<(&'static str, &'static str)> {
    KINDS.iter().map(|e| (e.name, e.summary)).collect()
}

/// Whether a CUDA driver with at least one device is present (else replays need `simulate`).
#[pyfunction]
fn replay_gpu_available() -> bool {
    crate::cuda::device_count() > 0
}

crate::python::register_items! {
    functions: replay_logs, fit_search, fit_logs, replay_resource_names,
        replay_resource_summaries, replay_gpu_available;
}
