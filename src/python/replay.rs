//! `rrmm._rrmm.replay_logs` and helpers: the engine of `python -m rrmm replay`.

use super::errors::py_result;
use crate::replay::{
    build_resource_sized, replay, ReplayOptions, ReplayReport, Trace, RESOURCE_NAMES,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

/// One parsed log with its replays (built without the GIL).
struct LogResult {
    trace_info: TraceInfo,
    reports: Vec<ReplayReport>,
}

struct TraceInfo {
    threads: usize,
    streams: usize,
    null_rows: usize,
    warning_messages: Vec<String>,
    peak_requested_bytes: usize,
}

#[allow(clippy::too_many_arguments)]
fn run(
    logs: &[String],
    resources: &[String],
    simulate: Option<usize>,
    initial_pool_size: Option<usize>,
    maximum_pool_size: Option<usize>,
    arena_size: Option<usize>,
    options: ReplayOptions,
    lenient: bool,
) -> crate::Result<Vec<LogResult>> {
    let mut out = Vec::with_capacity(logs.len());
    for log in logs {
        let trace = Trace::from_path(log, lenient)?;
        let mut reports = Vec::with_capacity(resources.len());
        for name in resources {
            // A fresh resource per replay, dropped before the next is built.
            let mr = build_resource_sized(
                name,
                simulate,
                initial_pool_size,
                maximum_pool_size,
                arena_size,
            )?;
            let mut report = replay(&trace, &mr, options)?;
            report.resource = name.clone();
            reports.push(report);
        }
        out.push(LogResult {
            trace_info: TraceInfo {
                threads: trace.threads.len(),
                streams: trace.streams.len(),
                null_rows: trace.null_rows,
                warning_messages: trace.warning_messages.clone(),
                peak_requested_bytes: trace.peak_requested_bytes,
            },
            reports,
        });
    }
    Ok(out)
}

fn report_dict<'py>(
    py: Python<'py>,
    r: &ReplayReport,
    info: &TraceInfo,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("log", &r.source)?;
    d.set_item("resource", &r.resource)?;
    d.set_item("events", r.events)?;
    d.set_item("allocations", r.allocations)?;
    d.set_item("total_ns", r.total_ns)?;
    d.set_item("ns_per_event", r.ns_per_event)?;
    d.set_item("peak_bytes_in_use", r.peak_bytes_in_use)?;
    d.set_item("peak_footprint", r.peak_footprint)?;
    d.set_item("fragmentation_at_peak", r.fragmentation_at_peak)?;
    d.set_item("fragmentation_at_end", r.fragmentation_at_end)?;
    d.set_item("footprint_at_end", r.footprint_at_end.map(|f| f.held_bytes))?;
    d.set_item("failed_allocations", r.failed_allocations)?;
    d.set_item("failed_bytes", r.failed_bytes)?;
    d.set_item("failure_events", PyList::new(py, &r.failure_events)?)?;
    d.set_item("leaked_allocations", r.leaked_allocations)?;
    d.set_item("leaked_bytes", r.leaked_bytes)?;
    d.set_item("logged_failures", r.logged_failures)?;
    d.set_item("parse_warnings", r.parse_warnings)?;
    d.set_item("warning_messages", PyList::new(py, &info.warning_messages)?)?;
    d.set_item("threads", info.threads)?;
    d.set_item("streams", info.streams)?;
    d.set_item("null_rows", info.null_rows)?;
    d.set_item("log_peak_bytes", info.peak_requested_bytes)?;
    let timeline = PyDict::new(py);
    let events: Vec<usize> = r.timeline.iter().map(|p| p.event).collect();
    let in_use: Vec<usize> = r.timeline.iter().map(|p| p.bytes_in_use).collect();
    let footprint: Vec<Option<usize>> = r.timeline.iter().map(|p| p.footprint).collect();
    timeline.set_item("event", PyList::new(py, events)?)?;
    timeline.set_item("bytes_in_use", PyList::new(py, in_use)?)?;
    timeline.set_item("footprint", PyList::new(py, footprint)?)?;
    d.set_item("timeline", timeline)?;
    Ok(d)
}

/// Replays each RMM-format log against each named resource (a fresh one per replay) and
/// returns one dict per (log, resource), in that order. Runs without the GIL.
///
/// `simulate`: bytes of simulated device memory, or None for the real GPU. Raises ValueError
/// for bad input (naming file and line) or an unknown resource, OSError for an unreadable file,
/// RuntimeError for CUDA errors.
#[pyfunction]
#[pyo3(signature = (logs, resources, simulate=None, initial_pool_size=None, maximum_pool_size=None, lenient=false, timeline_points=0, progress=false, arena_size=None))]
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
    arena_size: Option<usize>,
) -> PyResult<Bound<'py, PyList>> {
    let options = ReplayOptions {
        timeline_points,
        progress,
    };
    let results = py_result(py.detach(|| {
        run(
            &logs,
            &resources,
            simulate,
            initial_pool_size,
            maximum_pool_size,
            arena_size,
            options,
            lenient,
        )
    }))?;
    let out = PyList::empty(py);
    for result in &results {
        for report in &result.reports {
            out.append(report_dict(py, report, &result.trace_info)?)?;
        }
    }
    Ok(out)
}

/// The resource names `replay_logs` accepts.
#[pyfunction]
fn replay_resource_names() -> Vec<&'static str> {
    RESOURCE_NAMES.to_vec()
}

/// Whether a CUDA driver with at least one device is present (else replays need `simulate`).
#[pyfunction]
fn replay_gpu_available() -> bool {
    crate::cuda::device_count() > 0
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(replay_logs, m)?)?;
    m.add_function(wrap_pyfunction!(replay_resource_names, m)?)?;
    m.add_function(wrap_pyfunction!(replay_gpu_available, m)?)?;
    Ok(())
}
