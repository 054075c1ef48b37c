//! `rrmm._rrmm.ReplayLog` and `replay_allocator`: the replay engine over an allocator written in
//! Python (PyTorch's caching allocator, CuPy's memory pool, rrmm through its Python API: the
//! peers of `rrmm replay`). The allocator's functions become the one Rust resource over Python
//! functions ([`PythonFunctions`]) and the engine replays
//! the log over it exactly as over rrmm's own kinds: the same passes, timing, repetitions,
//! freeing of what the log leaves live, and record. The replay runs without the GIL; each call
//! of a Python function takes it for that call only, and no Rust lock is held across one.

use super::errors::py_result;
use super::python_functions::{all_callable, PythonFunctions, Raised, StreamArg};
use super::replay::{repeat_of, to_python_any};
use crate::replay::{replay, ReplayOptions, ReplayRecord, Trace, PYTHON_DRIVER};
use crate::report::Footprint;
use crate::resource::MemoryKind;
use crate::SharedResource;
use parking_lot::Mutex;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use std::sync::Arc;

/// One RMM-format log, parsed once by the engine's parser (without the GIL), to replay through
/// allocators written in Python ([`replay_allocator`]).
#[pyclass(module = "rrmm._rrmm", name = "ReplayLog", frozen)]
pub(crate) struct ReplayLog {
    trace: Arc<Trace>,
}

#[pymethods]
impl ReplayLog {
    /// Parses the log at `path` (plain or gzipped CSV). Raises ValueError for bad input
    /// (naming file and line; `lenient` skips bad lines, counted), OSError for an unreadable
    /// file.
    #[new]
    #[pyo3(signature = (path, lenient=false))]
    fn new(py: Python<'_>, path: String, lenient: bool) -> PyResult<Self> {
        let trace = py_result(py.detach(|| Trace::from_path(&path, lenient)))?;
        Ok(ReplayLog {
            trace: Arc::new(trace),
        })
    }

    /// The log's facts as a replay record with no figures (resource "", driver "rust").
    #[getter]
    fn facts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_python_any(py, &ReplayRecord::of_log(&self.trace, ""))
    }
}

/// The figures functions of a replay's allocator, and the first exception one raised (figures
/// have no error path in the engine: the row reports it instead).
struct Figures {
    held_bytes: Option<Py<PyAny>>,
    free_blocks: Option<Py<PyAny>>,
    raised: Mutex<Option<PyErr>>,
}

impl Figures {
    /// Calls the figures function `f` and reads its value with `read`; the default (the
    /// first exception kept for the row) when either raises.
    fn figure<T: Default>(
        &self,
        f: &Py<PyAny>,
        read: impl FnOnce(&Bound<'_, PyAny>) -> PyResult<T>,
    ) -> T {
        Python::attach(|py| match f.bind(py).call0().and_then(|v| read(&v)) {
            Ok(v) => v,
            Err(e) => {
                self.raised.lock().get_or_insert(e);
                T::default()
            }
        })
    }

    /// The bytes the allocator holds (`held_bytes()`).
    fn held(&self) -> usize {
        self.held_bytes
            .as_ref()
            .map_or(0, |f| self.figure(f, |v| v.extract::<usize>()))
    }

    /// The sizes of its free blocks (`free_blocks()`).
    fn free(&self) -> Vec<usize> {
        self.free_blocks
            .as_ref()
            .map_or_else(Vec::new, |f| self.figure(f, |v| v.extract::<Vec<usize>>()))
    }
}

/// The resource over `functions` (the one Rust resource over Python functions), handing out
/// memory of `device` (None: no device, no streams made), reporting `figures` where given.
fn resource(
    functions: &Arc<PythonFunctions>,
    figures: &Arc<Figures>,
    device: Option<usize>,
) -> SharedResource {
    let kind = if device.is_some() {
        MemoryKind::Device
    } else {
        MemoryKind::Simulated
    };
    let mut mr = functions.resource(kind, device);
    if figures.held_bytes.is_some() {
        let h = figures.clone();
        let held = Box::new(move || h.held());
        let footprint = figures.free_blocks.is_some().then(|| {
            let g = figures.clone();
            Box::new(move || {
                let held_bytes = g.held();
                let free = g.free();
                Footprint {
                    held_bytes,
                    free_bytes: free.iter().sum(),
                    largest_free_block: free.iter().copied().max().unwrap_or(0),
                    free_blocks: free.len(),
                }
            }) as crate::resource::FootprintFn
        });
        mr = mr.with_figures(held, footprint);
    }
    Arc::new(mr)
}

/// `replay_allocator(log, name, allocate, deallocate, *, held_bytes=None, free_blocks=None,
/// out_of_memory=(), device=None, setup=None, repeat=None, timed=True, timeline_points=0)`:
/// replays `log` (a [`ReplayLog`]) through an allocator written in Python, by the engine that
/// replays rrmm's kinds (`replay_logs`): an untimed figures pass, then `repeat` timed
/// repetitions on the same, warm, allocator (None: at least 5 and 0.5 s; `timed=False`: the
/// figures pass alone), what the log leaves
/// live freed after each pass. Returns the row: a replay record named `name` with driver
/// `"python"` and `setup`.
///
/// `allocate(size, stream) -> int` returns the address (0 for out of memory; raising
/// `MemoryError` or one of the `out_of_memory` types is out of memory too: a failed allocation
/// of the row, its free skipped); `deallocate(ptr, size, stream)` frees it; `stream` is the
/// engine's handle for the log's stream (0, 1, 2 for the default streams). `held_bytes() ->
/// int` (the footprint, read after each allocation of the figures pass) and `free_blocks() ->
/// list[int]` (the sizes of the free blocks it holds, for fragmentation) give the memory
/// figures: without the first there is no footprint, without the second no fragmentation.
/// Internal waste is not known (None). `device`: the CUDA device of the memory (the engine
/// synchronizes it in each timed pass and makes a stream per stream of the log); None for
/// memory with no device. Any other exception raised by a function ends the replay with the
/// row's `error` set, after what is live is freed; one that is not an `Exception`
/// (`KeyboardInterrupt`) is raised.
#[pyfunction]
#[pyo3(signature = (log, name, allocate, deallocate, *, held_bytes=None, free_blocks=None, out_of_memory=None, device=None, setup=None, repeat=None, timed=true, timeline_points=0))]
#[allow(clippy::too_many_arguments)]
fn replay_allocator<'py>(
    py: Python<'py>,
    log: &ReplayLog,
    name: String,
    allocate: &Bound<'py, PyAny>,
    deallocate: &Bound<'py, PyAny>,
    held_bytes: Option<&Bound<'py, PyAny>>,
    free_blocks: Option<&Bound<'py, PyAny>>,
    out_of_memory: Option<&Bound<'py, PyAny>>,
    device: Option<usize>,
    setup: Option<String>,
    repeat: Option<&Bound<'py, PyAny>>,
    timed: bool,
    timeline_points: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let repeat = repeat_of(repeat, timed)?;
    all_callable(
        &[Some(allocate), Some(deallocate), held_bytes, free_blocks],
        "allocate, deallocate, held_bytes and free_blocks must be callable",
    )?;
    let functions = Arc::new(PythonFunctions::new(
        allocate,
        deallocate,
        StreamArg::Handle,
        Raised::AsIs {
            out_of_memory: out_of_memory.map(|t| t.clone().unbind()),
        },
    ));
    let figures = Arc::new(Figures {
        held_bytes: held_bytes.map(|f| f.clone().unbind()),
        free_blocks: free_blocks.map(|f| f.clone().unbind()),
        raised: Mutex::new(None),
    });
    let mr = resource(&functions, &figures, device);
    let options = ReplayOptions {
        timeline_points,
        repeat,
        ..ReplayOptions::default()
    };
    let trace = log.trace.clone();
    let outcome = py.detach(|| replay(&trace, &mr, options));
    drop(mr);
    let mut record = ReplayRecord::of_log(&trace, &name);
    record.driver = PYTHON_DRIVER.to_string();
    record.setup = setup;
    let raised = figures.raised.lock().take();
    let failure = match (outcome, raised) {
        (Ok(report), None) => {
            record = record.with_report(&report);
            None
        }
        (Ok(_), Some(err)) => Some(Err(err)),
        (Err(e), _) => Some(match e.callback_payload::<PyErr>() {
            Some(err) => Err(err.clone_ref(py)),
            None => Ok(e.to_string()),
        }),
    };
    if let Some(failure) = failure {
        let message = match failure {
            Ok(message) => message,
            // Not an `Exception` (an interrupt): the caller's to handle.
            Err(err) if !err.is_instance_of::<PyException>(py) => return Err(err),
            Err(err) => err.to_string(),
        };
        record.error = Some(message);
    } else {
        // The blocks holding its allocations are not known; nor its free blocks without
        // `free_blocks`.
        record.internal_waste_at_peak = None;
        record.internal_waste_at_end = None;
        if free_blocks.is_none() {
            record.fragmentation_at_peak = None;
            record.fragmentation_at_end = None;
        }
        if timeline_points == 0 {
            record.timeline = None;
        }
    }
    to_python_any(py, &record)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ReplayLog>()?;
    m.add_function(wrap_pyfunction!(replay_allocator, m)?)?;
    Ok(())
}
