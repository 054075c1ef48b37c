//! `rrmm._rrmm.replay_logs`, `fit_logs` and helpers: the engine of `python -m rrmm replay`.

use super::errors::py_result;
use crate::replay::{
    build, fit, replay, resource_names, BuiltResource, FitResult, Repeat, ReplayOptions,
    ReplayReport, ResourceOptions, Trace,
};
use crate::stack::KINDS;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

/// What a row of the report says about a log (the same for every resource).
struct TraceInfo {
    threads: usize,
    streams: usize,
    null_rows: usize,
    warning_messages: Vec<String>,
    peak_requested_bytes: u128,
    unfreed_allocations: usize,
    logged_failures: usize,
    warnings: usize,
    events: usize,
    allocations: usize,
    largest_request: usize,
}

impl TraceInfo {
    fn of(trace: &Trace) -> Self {
        TraceInfo {
            threads: trace.threads.len(),
            streams: trace.streams.len(),
            null_rows: trace.null_rows,
            warning_messages: trace.warning_messages.clone(),
            peak_requested_bytes: trace.peak_requested_bytes,
            unfreed_allocations: trace.unfreed_allocations,
            logged_failures: trace.logged_failures,
            warnings: trace.warnings,
            events: trace.events.len(),
            allocations: trace.allocations(),
            largest_request: trace.events.iter().map(|e| e.size).max().unwrap_or(0),
        }
    }
}

/// One resource's row: its report, or why it has none.
struct Row {
    name: String,
    setup: Option<String>,
    simulated_device: bool,
    outcome: Result<ReplayReport, String>,
}

/// One parsed log with its rows and fits (built without the GIL).
struct LogResult {
    source: String,
    info: TraceInfo,
    rows: Vec<Row>,
}

/// A replay's settings, as the command line gives them.
struct Settings {
    simulate: Option<usize>,
    options: ResourceOptions,
    replay: ReplayOptions,
    lenient: bool,
}

fn replay_one(
    trace: &Trace,
    built: &BuiltResource,
    settings: &Settings,
) -> crate::Result<ReplayReport> {
    let options = ReplayOptions {
        rounding: Some(built.rounding.clone()),
        largest_request: built.largest_request,
        ..settings.replay.clone()
    };
    let mut report = replay(trace, &built.resource, options)?;
    report.resource = built.name.clone();
    Ok(report)
}

fn run(
    logs: &[String],
    resources: &[String],
    settings: &Settings,
) -> crate::Result<Vec<LogResult>> {
    let mut out = Vec::with_capacity(logs.len());
    for log in logs {
        let trace = Trace::from_path(log, settings.lenient)?;
        let mut rows = Vec::with_capacity(resources.len());
        for name in resources {
            // A fresh resource per (log, resource), kept across its repetitions, dropped before
            // the next is built. A resource that cannot be built or replayed is its own row.
            let row = match build(name, settings.simulate, &settings.options) {
                Ok(built) => Row {
                    name: built.name.clone(),
                    setup: Some(built.setup.clone()),
                    simulated_device: built.simulated_device,
                    outcome: replay_one(&trace, &built, settings).map_err(|e| e.to_string()),
                },
                Err(e) => Row {
                    name: name.clone(),
                    setup: None,
                    simulated_device: false,
                    outcome: Err(format!("cannot be built: {e}")),
                },
            };
            rows.push(row);
        }
        out.push(LogResult {
            source: trace.source.clone(),
            info: TraceInfo::of(&trace),
            rows,
        });
    }
    Ok(out)
}

fn row_dict<'py>(
    py: Python<'py>,
    source: &str,
    row: &Row,
    info: &TraceInfo,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("log", source)?;
    d.set_item("resource", &row.name)?;
    d.set_item("setup", &row.setup)?;
    d.set_item("simulated_device", row.simulated_device)?;
    d.set_item("events", info.events)?;
    d.set_item("allocations", info.allocations)?;
    d.set_item("logged_failures", info.logged_failures)?;
    d.set_item("parse_warnings", info.warnings)?;
    d.set_item("warning_messages", PyList::new(py, &info.warning_messages)?)?;
    d.set_item("threads", info.threads)?;
    d.set_item("streams", info.streams)?;
    d.set_item("null_rows", info.null_rows)?;
    d.set_item("log_peak_bytes", info.peak_requested_bytes)?;
    d.set_item("log_unfreed_allocations", info.unfreed_allocations)?;
    d.set_item("log_largest_request", info.largest_request)?;
    let r = match &row.outcome {
        Ok(r) => r,
        Err(message) => {
            d.set_item("error", message)?;
            return Ok(d);
        }
    };
    d.set_item("error", py.None())?;
    d.set_item("total_ns", r.total_ns)?;
    d.set_item("ns_per_event", r.ns_per_event)?;
    d.set_item("ns_per_event_min", r.ns_per_event_min)?;
    d.set_item("ns_per_event_max", r.ns_per_event_max)?;
    d.set_item("ns_per_event_p25", r.ns_per_event_p25)?;
    d.set_item("ns_per_event_p75", r.ns_per_event_p75)?;
    d.set_item("spread", spread(r))?;
    d.set_item("repeats", r.repeats)?;
    d.set_item("samples_ns", PyList::new(py, &r.samples_ns)?)?;
    d.set_item("peak_bytes_in_use", r.peak_bytes_in_use)?;
    d.set_item("peak_footprint", r.peak_footprint)?;
    d.set_item("overhead", r.overhead)?;
    d.set_item("internal_waste_at_peak", r.internal_waste_at_peak)?;
    d.set_item("internal_waste_at_end", r.internal_waste_at_end)?;
    d.set_item("fragmentation_at_peak", r.fragmentation_at_peak)?;
    d.set_item("fragmentation_at_end", r.fragmentation_at_end)?;
    d.set_item("footprint_at_end", r.footprint_at_end.map(|f| f.held_bytes))?;
    d.set_item("failed_allocations", r.failed_allocations)?;
    d.set_item("failed_bytes", r.failed_bytes)?;
    d.set_item("failure_events", PyList::new(py, &r.failure_events)?)?;
    d.set_item("unservable_allocations", r.unservable_allocations)?;
    d.set_item("leaked_allocations", r.leaked_allocations)?;
    d.set_item("leaked_bytes", r.leaked_bytes)?;
    let timeline = PyDict::new(py);
    let events: Vec<usize> = r.timeline.iter().map(|p| p.event).collect();
    let in_use: Vec<u128> = r.timeline.iter().map(|p| p.bytes_in_use).collect();
    let footprint: Vec<Option<usize>> = r.timeline.iter().map(|p| p.footprint).collect();
    timeline.set_item("event", PyList::new(py, events)?)?;
    timeline.set_item("bytes_in_use", PyList::new(py, in_use)?)?;
    timeline.set_item("footprint", PyList::new(py, footprint)?)?;
    d.set_item("timeline", timeline)?;
    Ok(d)
}

/// Relative spread of the timings, interquartile range / median (robust to one preempted
/// repetition); `None` with fewer than two.
fn spread(r: &ReplayReport) -> Option<f64> {
    if r.samples_ns.len() < 2 {
        None
    } else if r.ns_per_event > 0.0 {
        Some((r.ns_per_event_p75 - r.ns_per_event_p25) / r.ns_per_event)
    } else {
        Some(0.0)
    }
}

fn fit_dict<'py>(
    py: Python<'py>,
    source: &str,
    name: &str,
    fit: &Result<FitResult, String>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("log", source)?;
    d.set_item("resource", name)?;
    match fit {
        Ok(f) => {
            d.set_item("device_bytes", f.device_bytes)?;
            d.set_item("failing_bytes", f.failing_bytes)?;
            d.set_item("initial_pool_size", f.pool_sizes.map(|p| p.0))?;
            d.set_item("maximum_pool_size", f.pool_sizes.and_then(|p| p.1))?;
            d.set_item("arena_size", f.arena_size)?;
            d.set_item("setup", &f.setup)?;
            d.set_item("replays", f.replays)?;
            d.set_item("reason", &f.reason)?;
        }
        Err(message) => {
            d.set_item("device_bytes", py.None())?;
            d.set_item("reason", message)?;
        }
    }
    Ok(d)
}

/// Replays each RMM-format log against each named resource and returns one dict per
/// (log, resource), in that order. Runs without the GIL.
///
/// `simulate`: bytes of simulated device memory, or None for the real GPU. `repeat`: timed
/// repetitions after the figures pass on the same resource (None: at least 5 and 0.5 s; 0: the
/// figures pass alone). A resource that cannot be built or fails with an error other than out
/// of memory gives a dict with `error` set. Raises ValueError for bad input (naming file and
/// line) or an unknown resource, OSError for an unreadable file.
#[pyfunction]
#[pyo3(signature = (logs, resources, simulate=None, initial_pool_size=None, maximum_pool_size=None, lenient=false, timeline_points=0, progress=false, repeat=None, bins=None, block_size=None, blocks=None, arena_size=None))]
#[allow(clippy::too_many_arguments)]
fn replay_logs<'py>(
    py: Python<'py>,
    logs: Vec<String>,
    resources: Vec<String>,
    simulate: Option<usize>,
    initial_pool_size: Option<usize>,
    maximum_pool_size: Option<usize>,
    lenient: bool,
    timeline_points: usize,
    progress: bool,
    repeat: Option<usize>,
    bins: Option<(u32, u32)>,
    block_size: Option<usize>,
    blocks: Option<usize>,
    arena_size: Option<usize>,
) -> PyResult<Bound<'py, PyList>> {
    check_names(&resources)?;
    let settings = Settings {
        simulate,
        options: ResourceOptions {
            initial_pool_size,
            maximum_pool_size,
            bins,
            block_size,
            blocks,
            arena_size,
            ..ResourceOptions::default()
        },
        replay: ReplayOptions {
            timeline_points,
            progress,
            repeat: match repeat {
                None => Repeat::Auto,
                Some(0) => Repeat::FiguresOnly,
                Some(n) => Repeat::Times(n),
            },
            ..ReplayOptions::default()
        },
        lenient,
    };
    let results = py_result(py.detach(|| run(&logs, &resources, &settings)))?;
    let reports = PyList::empty(py);
    for result in &results {
        for row in &result.rows {
            reports.append(row_dict(py, &result.source, row, &result.info)?)?;
        }
    }
    Ok(reports)
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

/// For each log and each named resource, the smallest simulated device on which the log replays
/// with no failed allocation (`--fit`): one dict per (log, resource) with `device_bytes` (None
/// when it fits nowhere, with `reason`), `failing_bytes`, the pool sizes and setup on the device
/// found. Runs without the GIL.
#[pyfunction]
#[pyo3(signature = (logs, resources, initial_pool_size=None, maximum_pool_size=None, lenient=false, bins=None, block_size=None, blocks=None, arena_size=None))]
#[allow(clippy::too_many_arguments)]
fn fit_logs<'py>(
    py: Python<'py>,
    logs: Vec<String>,
    resources: Vec<String>,
    initial_pool_size: Option<usize>,
    maximum_pool_size: Option<usize>,
    lenient: bool,
    bins: Option<(u32, u32)>,
    block_size: Option<usize>,
    blocks: Option<usize>,
    arena_size: Option<usize>,
) -> PyResult<Bound<'py, PyList>> {
    check_names(&resources)?;
    let options = ResourceOptions {
        initial_pool_size,
        maximum_pool_size,
        bins,
        block_size,
        blocks,
        arena_size,
        ..ResourceOptions::default()
    };
    type Fits = Vec<(String, Vec<(String, Result<FitResult, String>)>)>;
    let results: Fits = py_result(py.detach(|| -> crate::Result<Fits> {
        let mut out = Vec::new();
        for log in &logs {
            let trace = Trace::from_path(log, lenient)?;
            let fits = resources
                .iter()
                .map(|name| {
                    let name = crate::replay::canonical_name(name);
                    let f = fit(&trace, &name, &options).map_err(|e| e.to_string());
                    (name, f)
                })
                .collect();
            out.push((trace.source.clone(), fits));
        }
        Ok(out)
    }))?;
    let list = PyList::empty(py);
    for (source, fits) in &results {
        for (name, f) in fits {
            list.append(fit_dict(py, source, name, f)?)?;
        }
    }
    Ok(list)
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

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(replay_logs, m)?)?;
    m.add_function(wrap_pyfunction!(fit_logs, m)?)?;
    m.add_function(wrap_pyfunction!(replay_resource_names, m)?)?;
    m.add_function(wrap_pyfunction!(replay_resource_summaries, m)?)?;
    m.add_function(wrap_pyfunction!(replay_gpu_available, m)?)?;
    Ok(())
}
