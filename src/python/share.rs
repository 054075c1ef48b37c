//! `rrmm.share` from Python: an exporter of memory-file segments, a published expandable pool
//! ([`SharePublication`]) and an importer's attachment ([`crate::shared_memory`]). A resolved
//! name is a dict in the shape of `__cuda_array_interface__` (on the CPU stand-in, its address
//! is a host address), or an object that exposes it ([`SharedArray`]: CuPy, PyTorch and Numba
//! take it; NumPy takes its `__array_interface__` on the host). Every call that waits on the
//! other process runs without the GIL, within the attachment's deadline.

use super::edge::dlpack;
use super::errors::to_pyerr;
use crate::shared_gpu::ledger_dir::{default_base, LedgerDir};
use crate::shared_memory::{
    AttachOptions, Attachment, BufferSpec, ExportOptions, Exporter, FreeOutcome, MemfdSegment,
    Resolved, ShareError,
};
use crate::suballocator::{ExpandableMemoryResource, PoolExport};
use parking_lot::Mutex;
use pyo3::exceptions::{
    PyBufferError, PyFileNotFoundError, PyKeyError, PyRuntimeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
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
    ledger(directory, HOST_KEY)
}

/// The ledger directory of `key` (a device's UUID, or `host`) under `directory` (default: the
/// ledgers' base).
fn ledger(directory: Option<PathBuf>, key: &str) -> PyResult<LedgerDir> {
    let base = directory.unwrap_or_else(default_base);
    LedgerDir::open(&base, key).map_err(to_pyerr)
}

fn closed() -> PyErr {
    PyRuntimeError::new_err("closed")
}

/// The socket an exporter named `name` listens on, under `directory` (default: the ledgers'
/// base), in the directory of device `device`'s UUID (None: host memory's).
#[pyfunction]
#[pyo3(signature = (name, directory=None, device=None))]
fn _share_path(name: &str, directory: Option<PathBuf>, device: Option<usize>) -> PyResult<String> {
    let key = match device {
        Some(d) => crate::cuda::device_uuid(d).map_err(to_pyerr)?,
        None => HOST_KEY.to_string(),
    };
    let path = ledger(directory, &key)?
        .share_path(name)
        .map_err(to_pyerr)?;
    Ok(path.to_string_lossy().into_owned())
}

/// A figures record as a dict of ints.
pub(crate) fn figures_dict(
    py: Python<'_>,
    map: serde_json::Map<String, serde_json::Value>,
) -> PyResult<Bound<'_, PyDict>> {
    let dict = PyDict::new(py);
    for (key, value) in map {
        dict.set_item(key, value.as_u64().unwrap_or(0))?;
    }
    Ok(dict)
}

/// A published expandable pool (`rrmm.share.PoolPublication`): names the pool's arrays and
/// buffers for importers.
#[pyclass(module = "rrmm._rrmm", name = "SharePublication", frozen)]
pub(crate) struct SharePublication {
    inner: PoolExport,
}

impl SharePublication {
    /// Publishes `pool` as the exporter `name` in the ledger directory of its memory.
    pub(crate) fn start(
        py: Python<'_>,
        pool: &ExpandableMemoryResource,
        name: &str,
        directory: Option<PathBuf>,
    ) -> PyResult<SharePublication> {
        let key = pool.share_key().map_err(to_pyerr)?;
        let dir = ledger(directory, &key)?;
        let path = crate::shared_memory::socket_path(&dir, name).map_err(py_err)?;
        let inner = py
            .detach(|| pool.publish(&path, ExportOptions::default()))
            .map_err(to_pyerr)?;
        Ok(SharePublication { inner })
    }
}

/// What a buffer to name is: its pointer, bytes, dtype, shape and whether it is read-only.
struct Described {
    ptr: usize,
    nbytes: usize,
    dtype: String,
    shape: Vec<u64>,
    readonly: bool,
}

/// The bytes of one element of a NumPy type string (`<f4`: 4).
fn itemsize(typestr: &str) -> PyResult<usize> {
    typestr
        .get(2..)
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .ok_or_else(|| PyValueError::new_err(format!("typestr {typestr:?} has no item size")))
}

/// Describes `buffer`: an object with `__cuda_array_interface__` or `__array_interface__`
/// (C-contiguous), a `DeviceBuffer` (`ptr` and `size`), or an address with `nbytes`.
fn describe(buffer: &Bound<'_, PyAny>, nbytes: Option<usize>) -> PyResult<Described> {
    if let Ok(ptr) = buffer.extract::<usize>() {
        let nbytes = nbytes
            .ok_or_else(|| PyValueError::new_err("nbytes is needed with a pointer (an int)"))?;
        return Ok(Described {
            ptr,
            nbytes,
            dtype: "|u1".into(),
            shape: vec![nbytes as u64],
            readonly: false,
        });
    }
    let face = ["__cuda_array_interface__", "__array_interface__"]
        .iter()
        .find_map(|attr| buffer.getattr(*attr).ok());
    if let Some(face) = face {
        let (ptr, readonly): (usize, bool) = face.get_item("data")?.extract()?;
        let shape: Vec<u64> = face.get_item("shape")?.extract()?;
        let dtype: String = face.get_item("typestr")?.extract()?;
        let item = itemsize(&dtype)?;
        let count: u64 = shape.iter().product();
        let size = usize::try_from(count)
            .ok()
            .and_then(|c| c.checked_mul(item))
            .ok_or_else(|| PyValueError::new_err("the array's size overflows"))?;
        let strides: Option<Vec<i64>> =
            face.get_item("strides").ok().and_then(|s| s.extract().ok());
        if let Some(strides) = strides {
            let mut want = item as i64;
            for (&dim, &stride) in shape.iter().zip(&strides).rev() {
                if dim > 1 && stride != want {
                    return Err(PyValueError::new_err(
                        "only C-contiguous arrays can be shared (make a contiguous copy)",
                    ));
                }
                want *= dim as i64;
            }
        }
        return Ok(Described {
            ptr,
            nbytes: nbytes.unwrap_or(size),
            dtype,
            shape,
            readonly,
        });
    }
    let ptr: usize = buffer.getattr("ptr")?.extract()?;
    let size = match nbytes {
        Some(n) => n,
        None => buffer.getattr("size")?.extract()?,
    };
    Ok(Described {
        ptr,
        nbytes: size,
        dtype: "|u1".into(),
        shape: vec![size as u64],
        readonly: false,
    })
}

#[pymethods]
impl SharePublication {
    /// The socket importers attach to.
    #[getter]
    fn path(&self) -> PyResult<String> {
        let path = self.inner.path().map_err(to_pyerr)?;
        Ok(path.to_string_lossy().into_owned())
    }

    /// Names `buffer` (a CuPy array, tensor or NumPy view with `__cuda_array_interface__` or
    /// `__array_interface__`, a `DeviceBuffer`, or a pointer with `nbytes`) as `name`; it must
    /// lie in a live block of the pool (its start, or a view into it) and be C-contiguous. `dtype` and `shape` override the
    /// array's (default for a buffer: bytes); `readonly` marks it read-only for importers.
    /// The pages it lies on are exported once and kept mapped while published; its free (the
    /// array dropped) waits for the importers that hold it.
    #[pyo3(signature = (name, buffer, nbytes=None, dtype=None, shape=None, readonly=None))]
    #[allow(clippy::too_many_arguments)]
    fn share(
        &self,
        py: Python<'_>,
        name: &str,
        buffer: &Bound<'_, PyAny>,
        nbytes: Option<usize>,
        dtype: Option<String>,
        shape: Option<Vec<u64>>,
        readonly: Option<bool>,
    ) -> PyResult<()> {
        let d = describe(buffer, nbytes)?;
        let dtype = dtype.unwrap_or(d.dtype);
        let shape = shape.unwrap_or(d.shape);
        let readonly = readonly.unwrap_or(d.readonly);
        let inner = &self.inner;
        py.detach(|| inner.name(name, d.ptr, d.nbytes, &dtype, &shape, readonly))
            .map_err(to_pyerr)
    }

    /// The names exported now.
    fn names(&self) -> PyResult<Vec<String>> {
        self.inner.names().map_err(to_pyerr)
    }

    /// The pool's share figures (as `ExpandableMemoryResource.share_figures()`).
    fn figures<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        figures_dict(py, self.inner.figures().to_map())
    }

    /// Stops serving; importers keep what they map, and the blocks they hold are kept out of
    /// use for good.
    fn close(&self, py: Python<'_>) {
        let inner = &self.inner;
        py.detach(|| inner.close());
    }
}

/// A buffer an importer resolved (`rrmm.share.SharedArray`): `__cuda_array_interface__` for
/// device memory (`cupy.asarray`, `torch.as_tensor(..., device="cuda")`, Numba), and
/// `__array_interface__` for host memory (`numpy.asarray`). It keeps its attachment open.
#[pyclass(module = "rrmm._rrmm", name = "SharedArray", frozen)]
pub(crate) struct SharedArray {
    resolved: Resolved,
    _attachment: Py<ShareAttachment>,
}

impl SharedArray {
    fn face<'py>(&self, py: Python<'py>, want_host: bool) -> PyResult<Bound<'py, PyDict>> {
        if self.resolved.host != want_host {
            let (has, not) = match self.resolved.host {
                true => ("host", "__cuda_array_interface__"),
                false => ("device", "__array_interface__"),
            };
            return Err(pyo3::exceptions::PyAttributeError::new_err(format!(
                "{not}: the buffer {:?} lies in {has} memory",
                self.resolved.name
            )));
        }
        let dict = interface(py, &self.resolved)?;
        dict.del_item("size")?;
        dict.del_item("host")?;
        Ok(dict)
    }
}

#[pymethods]
impl SharedArray {
    /// The interface CuPy, PyTorch and Numba read (device memory only).
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.face(py, false)
    }

    /// The interface NumPy reads (host memory only: the CPU stand-in).
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.face(py, true)
    }

    /// DLPack's device of the buffer: `(1, 0)` on the host, `(2, ordinal)` on a GPU.
    fn __dlpack_device__(&self) -> PyResult<(i32, i32)> {
        if self.resolved.host {
            return Ok((dlpack::DEVICE_CPU, 0));
        }
        let ordinal = crate::cuda::device_ordinal_of(self.resolved.addr).ok_or_else(|| {
            PyBufferError::new_err("the buffer's device is not known to the driver")
        })?;
        let ordinal = i32::try_from(ordinal).map_err(|_| PyBufferError::new_err("ordinal"))?;
        Ok((dlpack::DEVICE_CUDA, ordinal))
    }

    /// The buffer as a DLPack capsule (`torch.from_dlpack`, `cupy.from_dlpack`,
    /// `numpy.from_dlpack`): the memory itself, C-contiguous, kept mapped while the tensor
    /// lives. `stream` is accepted and not waited on (nothing of this process writes the
    /// buffer); `copy=True` and another `dl_device` are refused, as is a read-only buffer on the
    /// host (DLPack's unversioned tensor cannot say read-only; a write would fault).
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        slf: &Bound<'py, Self>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<&Bound<'py, PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = (stream, max_version);
        let me = slf.get();
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "copy=True: a shared buffer is handed over as the exporter's memory, never copied",
            ));
        }
        let device = me.__dlpack_device__()?;
        if dl_device.is_some_and(|d| d != device) {
            return Err(PyBufferError::new_err(format!(
                "dl_device {dl_device:?}: the buffer lies on {device:?}"
            )));
        }
        if me.resolved.host && me.resolved.readonly {
            return Err(PyBufferError::new_err(format!(
                "{:?} is read-only here and DLPack's tensor cannot say so: use \
                 numpy.asarray (its __array_interface__ says read-only)",
                me.resolved.name
            )));
        }
        dlpack::capsule(
            slf.py(),
            slf.clone().into_any().unbind(),
            me.resolved.addr,
            device,
            &me.resolved.dtype,
            &me.resolved.shape,
        )
    }

    /// Its name.
    #[getter]
    fn name(&self) -> &str {
        &self.resolved.name
    }

    /// Its address in this process.
    #[getter]
    fn ptr(&self) -> usize {
        self.resolved.addr
    }

    /// Its bytes.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.resolved.size
    }

    /// Its shape.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.resolved.shape)
    }

    /// Its NumPy type string.
    #[getter]
    fn typestr(&self) -> &str {
        &self.resolved.dtype
    }

    /// Whether this process must not write it.
    #[getter]
    fn readonly(&self) -> bool {
        self.resolved.readonly
    }

    /// Whether it lies in host memory.
    #[getter]
    fn host(&self) -> bool {
        self.resolved.host
    }
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
        figures_dict(py, figures.to_map())
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
            .map_err(|e| match e {
                // Nothing listens there (no socket, or one an exporter left when it ended
                // without closing): say where it looked and what would serve it.
                ShareError::Gone => PyFileNotFoundError::new_err(format!(
                    "no exporter is serving at {}{}: start one with pool.publish(name) or \
                     rrmm.share.publish(name) (same name and directory), or check them",
                    path.display(),
                    if path.exists() {
                        " (a socket is there, but the exporter that made it has ended)"
                    } else {
                        ""
                    }
                )),
                other => py_err(other),
            })?;
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

    /// `name` as an object exposing `__cuda_array_interface__` (device memory) or
    /// `__array_interface__` (host memory); it keeps this attachment open.
    fn get(slf: &Bound<'_, Self>, name: String) -> PyResult<SharedArray> {
        let py = slf.py();
        let mut all = slf
            .get()
            .with(py, move |a| a.resolve_many(&[name.as_str()]))?;
        let resolved = all
            .pop()
            .ok_or_else(|| PyRuntimeError::new_err("no answer for the name"))?;
        Ok(SharedArray {
            resolved,
            _attachment: slf.clone().unbind(),
        })
    }

    /// `names` as objects exposing their array interface (as `get`), resolved in batches.
    /// The collector is paused while the objects are made (thousands of them would start
    /// collections that walk every object of a process that imported CuPy or PyTorch).
    fn get_many<'py>(slf: &Bound<'py, Self>, names: Vec<String>) -> PyResult<Bound<'py, PyList>> {
        let py = slf.py();
        let all = slf.get().with(py, move |a| {
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            a.resolve_many(&refs)
        })?;
        let _paused = CollectorPaused::new(py)?;
        let arrays = all
            .into_iter()
            .map(|resolved| {
                Bound::new(
                    py,
                    SharedArray {
                        resolved,
                        _attachment: slf.clone().unbind(),
                    },
                )
            })
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, arrays)
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

    /// The runs of a pool's pages this process maps side by side, as `(first address,
    /// bytes)` in address order (every array of a pool lies in one); empty before one is
    /// mapped, for a plain exporter, and once closed.
    #[getter]
    fn placed_runs(&self) -> Vec<(usize, usize)> {
        self.inner
            .lock()
            .as_ref()
            .map_or_else(Vec::new, Attachment::placed_runs)
    }

    /// How many segments this process maps read-only (a write there faults): those exported
    /// read-only, and a pool's pages that carry only read-only names it resolved; 0 once
    /// closed.
    #[getter]
    fn read_only_segments(&self) -> usize {
        self.inner
            .lock()
            .as_ref()
            .map_or(0, Attachment::read_only_segments)
    }

    /// Detaches: the exporter lets go of this importer's leases, and its maps go.
    fn close(&self, py: Python<'_>) {
        let attachment = self.inner.lock().take();
        py.detach(|| drop(attachment));
    }
}

/// Python's garbage collector paused while it lives (when it was running), restarted when
/// it is dropped.
struct CollectorPaused<'py> {
    gc: Option<Bound<'py, PyModule>>,
}

impl<'py> CollectorPaused<'py> {
    fn new(py: Python<'py>) -> PyResult<Self> {
        let gc = py.import("gc")?;
        if !gc.call_method0("isenabled")?.is_truthy()? {
            return Ok(CollectorPaused { gc: None });
        }
        gc.call_method0("disable")?;
        Ok(CollectorPaused { gc: Some(gc) })
    }
}

impl Drop for CollectorPaused<'_> {
    fn drop(&mut self) {
        if let Some(gc) = &self.gc {
            // Restarting cannot fail short of the interpreter's end; nothing to do then.
            let _ = gc.call_method0("enable");
        }
    }
}

super::register_items!(
    classes: ShareExporter, ShareAttachment, SharePublication, SharedArray;
    functions: _share_path;
);
