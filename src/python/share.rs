//! `rrmm.share` from Python: an exporter of memory-file segments and an importer's attachment
//! ([`crate::shared_memory`]). A resolved name is a dict in the shape of
//! `__cuda_array_interface__` (on the CPU stand-in, its address is a host address). Every call
//! that waits on the other process runs without the GIL, within the attachment's deadline.

use super::errors::to_pyerr;
use crate::shared_gpu::ledger_dir::{default_base, LedgerDir};
use crate::shared_memory::{
    AttachOptions, Attachment, BufferSpec, ExportOptions, Exporter, FreeOutcome, MemfdSegment,
    Resolved, ShareError,
};
use parking_lot::Mutex;
use pyo3::exceptions::{PyKeyError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};
use std::path::PathBuf;
use std::time::Duration;

/// The ledger key of host memory shared through memory files (a GPU's is its UUID).
const HOST_KEY: &str = "host";

/// A sharing error as the Python exception that fits: an unknown name is a `KeyError`, a bad
/// argument a `ValueError`, the rest a `RuntimeError`.
fn py_err(e: ShareError) -> PyErr {
    match e {
        ShareError::UnknownName(name) => PyKeyError::new_err(name),
        ShareError::Invalid { .. } | ShareError::NameTaken(_) => {
            PyValueError::new_err(e.to_string())
        }
        ShareError::Driver(e) => to_pyerr(e),
        other => PyRuntimeError::new_err(other.to_string()),
    }
}

/// The ledger directory of host memory under `directory` (default: the ledgers' base).
fn host_ledger(directory: Option<PathBuf>) -> PyResult<LedgerDir> {
    let base = directory.unwrap_or_else(default_base);
    LedgerDir::open(&base, HOST_KEY).map_err(to_pyerr)
}

fn closed() -> PyErr {
    PyRuntimeError::new_err("closed")
}

/// The socket an exporter named `name` listens on, under `directory` (default: the ledgers'
/// base).
#[pyfunction]
#[pyo3(signature = (name, directory=None))]
fn _share_path(name: &str, directory: Option<PathBuf>) -> PyResult<String> {
    let path = host_ledger(directory)?.share_path(name).map_err(to_pyerr)?;
    Ok(path.to_string_lossy().into_owned())
}

/// An exporter of memory-file segments (`rrmm.share.Exporter`).
#[pyclass(module = "rrmm._rrmm", name = "ShareExporter", frozen)]
pub(crate) struct ShareExporter {
    inner: Mutex<Option<Exporter>>,
}

impl ShareExporter {
    fn with<T>(&self, f: impl FnOnce(&Exporter) -> Result<T, ShareError>) -> PyResult<T> {
        let inner = self.inner.lock();
        f(inner.as_ref().ok_or_else(closed)?).map_err(py_err)
    }
}

#[pymethods]
impl ShareExporter {
    /// Starts an exporter named `name` in the ledger directory of host memory.
    #[new]
    #[pyo3(signature = (name, directory=None, accept_adoption=false))]
    fn new(name: &str, directory: Option<PathBuf>, accept_adoption: bool) -> PyResult<Self> {
        let dir = host_ledger(directory)?;
        let options = ExportOptions {
            accept_adoption,
            ..ExportOptions::default()
        };
        let exporter = Exporter::in_ledger(&dir, name, options).map_err(py_err)?;
        Ok(ShareExporter {
            inner: Mutex::new(Some(exporter)),
        })
    }

    /// The socket importers attach to.
    #[getter]
    fn path(&self) -> PyResult<String> {
        self.with(|e| Ok(e.path().to_string_lossy().into_owned()))
    }

    /// A new memory-file segment of `size` bytes (zeroed); its number.
    #[pyo3(signature = (size, writable=true))]
    fn add_segment(&self, size: u64, writable: bool) -> PyResult<u32> {
        self.with(|e| Ok(e.add_segment(MemfdSegment::new(size, writable)?)))
    }

    /// Writes `data` at `offset` of segment `segment`.
    fn write(&self, segment: u32, offset: u64, data: &[u8]) -> PyResult<()> {
        self.with(|e| {
            let seg = e
                .segment(segment)
                .ok_or_else(|| ShareError::invalid("segment", format!("no segment {segment}")))?;
            let host = seg
                .host()
                .ok_or_else(|| ShareError::invalid("segment", "not host memory"))?;
            host.write(offset, data)
        })
    }

    /// Exports a buffer under `name`.
    #[pyo3(signature = (name, segment, offset, size, dtype="|u1", shape=None, readonly=false))]
    #[allow(clippy::too_many_arguments)]
    fn publish(
        &self,
        name: &str,
        segment: u32,
        offset: u64,
        size: u64,
        dtype: &str,
        shape: Option<Vec<u64>>,
        readonly: bool,
    ) -> PyResult<()> {
        let spec = BufferSpec {
            segment,
            offset,
            size,
            dtype: dtype.to_string(),
            shape: shape.unwrap_or_else(|| vec![size]),
            readonly,
        };
        self.with(|e| e.publish(name, spec))
    }

    /// Frees `name`: True when no importer held it (freed now), False when the free waits for
    /// the importers that hold it.
    fn free(&self, name: &str) -> PyResult<bool> {
        self.with(|e| Ok(e.withdraw(name)? == FreeOutcome::Now))
    }

    /// The names exported now.
    fn names(&self) -> PyResult<Vec<String>> {
        self.with(|e| Ok(e.names()))
    }

    /// The exporter's figures.
    fn figures<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let figures = self.with(|e| Ok(e.figures()))?;
        let dict = PyDict::new(py);
        for (key, value) in figures.to_map() {
            dict.set_item(key, value.as_u64().unwrap_or(0))?;
        }
        Ok(dict)
    }

    /// Stops serving and removes the socket; importers keep what they map.
    fn close(&self, py: Python<'_>) {
        let exporter = self.inner.lock().take();
        py.detach(|| drop(exporter));
    }
}

/// An importer's attachment to an exporter (`rrmm.share.Attachment`).
#[pyclass(module = "rrmm._rrmm", name = "ShareAttachment", frozen)]
pub(crate) struct ShareAttachment {
    inner: Mutex<Option<Attachment>>,
}

impl ShareAttachment {
    /// Runs `f` on the attachment without the GIL (it may wait on the exporter, within the
    /// attachment's deadline).
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Attachment) -> Result<T, ShareError> + Send,
    ) -> PyResult<T> {
        py.detach(|| {
            let mut inner = self.inner.lock();
            let attachment = inner.as_mut().ok_or(ShareError::Gone)?;
            f(attachment)
        })
        .map_err(py_err)
    }
}

/// A resolved name as a `__cuda_array_interface__`-style dict.
fn interface<'py>(py: Python<'py>, r: &Resolved) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("shape", PyTuple::new(py, &r.shape)?)?;
    dict.set_item("typestr", &r.dtype)?;
    dict.set_item("data", (r.addr, r.readonly))?;
    dict.set_item("strides", py.None())?;
    dict.set_item("version", 3)?;
    dict.set_item("size", r.size)?;
    dict.set_item("host", r.host)?;
    Ok(dict)
}

#[pymethods]
impl ShareAttachment {
    /// Attaches to the exporter listening at `path`, waiting at most `timeout` seconds for
    /// each of its answers.
    #[new]
    #[pyo3(signature = (path, timeout=5.0))]
    fn new(py: Python<'_>, path: PathBuf, timeout: f64) -> PyResult<Self> {
        let timeout = Duration::try_from_secs_f64(timeout)
            .map_err(|_| PyValueError::new_err("timeout must be a number of seconds >= 0"))?;
        let attachment = py
            .detach(|| Attachment::attach(&path, AttachOptions { timeout }))
            .map_err(py_err)?;
        Ok(ShareAttachment {
            inner: Mutex::new(Some(attachment)),
        })
    }

    /// Resolves `name`: a `__cuda_array_interface__`-style dict (`shape`, `typestr`, `data`
    /// as (address, read-only), `strides`, `version`, and `size` in bytes and `host`).
    fn resolve<'py>(&self, py: Python<'py>, name: String) -> PyResult<Bound<'py, PyDict>> {
        let r = self.with(py, move |a| a.resolve(&name))?;
        interface(py, &r)
    }

    /// A copy of the bytes of `name` (host memory).
    fn read<'py>(&self, py: Python<'py>, name: String) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = self.with(py, move |a| {
            let r = a.resolve(&name)?;
            a.read(&r)
        })?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Writes `data` at `offset` of `name` (host memory, writable buffers).
    fn write(&self, py: Python<'_>, name: String, offset: u64, data: Vec<u8>) -> PyResult<()> {
        self.with(py, move |a| {
            let r = a.resolve(&name)?;
            a.write(&r, offset, &data)
        })
    }

    /// Lets go of `names`; how many leases the exporter let go.
    fn release(&self, py: Python<'_>, names: Vec<String>) -> PyResult<u32> {
        self.with(py, move |a| {
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            a.release(&refs)
        })
    }

    /// Every name the exporter exports now.
    fn names(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        self.with(py, |a| a.names())
    }

    /// Hands every segment and held name to the exporter at `path` (adoption); how many
    /// segments and names it took.
    fn hand_back(&self, py: Python<'_>, path: PathBuf) -> PyResult<(usize, u32)> {
        self.with(py, move |a| a.hand_back(&path))
    }

    /// Whether the exporter is known to be gone.
    #[getter]
    fn exporter_gone(&self) -> bool {
        self.inner
            .lock()
            .as_ref()
            .map_or(true, Attachment::exporter_gone)
    }

    /// Detaches: the exporter lets go of this importer's leases, and its maps go.
    fn close(&self, py: Python<'_>) {
        let attachment = self.inner.lock().take();
        py.detach(|| drop(attachment));
    }
}

super::register_items!(classes: ShareExporter, ShareAttachment; functions: _share_path;);
