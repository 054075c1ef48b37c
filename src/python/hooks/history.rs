//! `rrmm.record_memory_history`: a bounded record of allocations and frees made through
//! `DeviceBuffer` and the CuPy, Numba and PyTorch hooks, each with the Python stack that made it,
//! in the trace layout of PyTorch's `torch.cuda.memory._snapshot()["device_traces"]` (so
//! `torch.cuda._memory_viz` and `rrmm snapshot view` draw its timeline).
//!
//! Off, a call costs one relaxed atomic load. On, it takes the GIL (which the Python entry
//! points hold already), walks at most [`MAX_FRAMES`] Python frames, and appends one entry to a
//! ring of `max_entries` behind a lock held only for the push.

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The most Python frames kept per entry (innermost first, as PyTorch keeps them).
pub(super) const MAX_FRAMES: usize = 16;

// Why process-wide: PyTorch's `record_memory_history` is process-wide; one load per call.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// One frame: file, line, function.
type Frame = (Py<PyAny>, i64, Py<PyAny>);

struct Entry {
    action: &'static str,
    device: usize,
    addr: usize,
    size: usize,
    stream: usize,
    time_us: u64,
    frames: Vec<Frame>,
}

struct Record {
    entries: VecDeque<Entry>,
    max_entries: usize,
    stacks: bool,
}

// Why process-wide: the one history `record_memory_history` keeps and `_snapshot` reads.
static RECORD: Mutex<Option<Record>> = Mutex::new(None);

/// Whether history is being recorded (one relaxed load).
#[inline]
pub(crate) fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The calling thread's Python stack, innermost first, at most [`MAX_FRAMES`] frames.
fn python_frames(py: Python<'_>) -> Vec<Frame> {
    let mut frames = Vec::new();
    let Ok(sys) = py.import("sys") else {
        return frames;
    };
    let mut frame = sys.call_method1("_getframe", (0,)).ok();
    while let Some(f) = frame {
        if f.is_none() || frames.len() >= MAX_FRAMES {
            break;
        }
        let code = f.getattr("f_code").ok();
        let file = code.as_ref().and_then(|c| c.getattr("co_filename").ok());
        let name = code.as_ref().and_then(|c| c.getattr("co_name").ok());
        let line = f
            .getattr("f_lineno")
            .ok()
            .and_then(|l| l.extract::<i64>().ok())
            .unwrap_or(0);
        if let (Some(file), Some(name)) = (file, name) {
            frames.push((file.unbind(), line, name.unbind()));
        }
        frame = f.getattr("f_back").ok();
    }
    frames
}

/// Records one event (`"alloc"` or `"free_completed"`), when recording is on: one relaxed
/// load on every allocation path when it is off.
#[inline]
pub(crate) fn record(action: &'static str, device: usize, addr: usize, size: usize, stream: usize) {
    if enabled() && size != 0 {
        record_on(action, device, addr, size, stream);
    }
}

/// [`record`] when recording is on. Takes the GIL (already held on the Python entry points).
#[cold]
fn record_on(action: &'static str, device: usize, addr: usize, size: usize, stream: usize) {
    Python::attach(|py| {
        let stacks = RECORD.lock().as_ref().is_some_and(|r| r.stacks);
        let frames = if stacks {
            python_frames(py)
        } else {
            Vec::new()
        };
        let time_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        let entry = Entry {
            action,
            device,
            addr,
            size,
            stream,
            time_us,
            frames,
        };
        let dropped = {
            let mut guard = RECORD.lock();
            let Some(record) = guard.as_mut() else {
                return;
            };
            let dropped = if record.entries.len() >= record.max_entries {
                record.entries.pop_front()
            } else {
                None
            };
            record.entries.push_back(entry);
            dropped
        };
        // Python references of a dropped entry are released outside the lock.
        drop(dropped);
    });
}

/// `_record_memory_history(enabled, max_entries, stacks)`: starts (clearing what was recorded)
/// or stops recording.
#[pyfunction]
#[pyo3(signature = (enabled, max_entries = 100_000, stacks = true))]
fn _record_memory_history(enabled: bool, max_entries: usize, stacks: bool) {
    let mut guard = RECORD.lock();
    if enabled {
        *guard = Some(Record {
            entries: VecDeque::new(),
            max_entries: max_entries.max(1),
            stacks,
        });
    } else {
        *guard = None;
    }
    ENABLED.store(enabled, Ordering::Relaxed);
}

/// `_memory_history(device)`: the recorded entries of `device`, oldest first, as PyTorch's
/// trace dicts (`action`, `addr`, `size`, `stream`, `time_us`, `frames`).
#[pyfunction]
fn _memory_history<'py>(py: Python<'py>, device: usize) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    let guard = RECORD.lock();
    let Some(record) = guard.as_ref() else {
        return Ok(out);
    };
    for e in record.entries.iter().filter(|e| e.device == device) {
        let d = PyDict::new(py);
        crate::python::set_fields!(d, e; action, addr, size, stream, time_us);
        let frames = PyList::empty(py);
        for (file, line, name) in &e.frames {
            let f = PyDict::new(py);
            f.set_item("filename", file.bind(py))?;
            f.set_item("line", *line)?;
            f.set_item("name", name.bind(py))?;
            frames.append(f)?;
        }
        d.set_item("frames", frames)?;
        out.append(d)?;
    }
    Ok(out)
}

crate::python::register_items! {
    functions: _record_memory_history, _memory_history;
}
