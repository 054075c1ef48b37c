//! The adaptors of `rrmm.mr`: limiting, logging, statistics, tracking, failure callback,
//! prefetch and aligned. Each calls its upstream as its upstream is called (see `gil`); the
//! failure callback also runs Python code of its own.

use crate::adaptor::{
    AlignedResourceAdaptor as RsAligned, FailureCallbackResourceAdaptor as RsFailureCallback,
    FallbackResourceAdaptor as RsFallback, LimitingResourceAdaptor as RsLimiting,
    LoggingResourceAdaptor as RsLogging, PrefetchResourceAdaptor as RsPrefetch,
    StatisticsResourceAdaptor as RsStatisticsAdaptor, TrackingResourceAdaptor as RsTracking,
};
use crate::MemoryResource;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::PyClass;
use std::sync::Arc;

use super::convert::{bytes_arg, upstream_arg};
use super::resource::{over_upstream, DeviceMemoryResource, UpstreamResourceAdaptor};
use super::statistics::Statistics;
use super::upstream_kw::{required, upstream_of};
use crate::python::callable_ref::CallableRef;
use crate::python::errors::{callback_error, py_result};
use crate::python::record::record_dict;

/// The initializer of an adaptor class over `up` whose Rust adaptor serves both the base class
/// (allocate, deallocate) and the class's own methods, through the handle `leaf` keeps.
fn adaptor_keeping<R, T>(
    up: Py<DeviceMemoryResource>,
    adaptor: R,
    leaf: impl FnOnce(Arc<R>) -> T,
) -> PyClassInitializer<T>
where
    R: MemoryResource + 'static,
    T: PyClass<BaseType = UpstreamResourceAdaptor>,
{
    let adaptor = Arc::new(adaptor);
    over_upstream(leaf(adaptor.clone()), up, adaptor)
}

/// Fails allocations beyond `allocation_limit` bytes in total (RMM's
/// `LimitingResourceAdaptor`).
#[pyclass(module = "rrmm.mr", name = "LimitingResourceAdaptor", extends = UpstreamResourceAdaptor, frozen)]
pub(super) struct LimitingResourceAdaptor {
    pub(super) limiting: Arc<RsLimiting>,
}

#[pymethods]
impl LimitingResourceAdaptor {
    #[new]
    #[pyo3(signature = (upstream_mr=None, allocation_limit=None, *, upstream=None))]
    fn new(
        upstream_mr: Option<&Bound<'_, PyAny>>,
        allocation_limit: Option<&Bound<'_, PyAny>>,
        upstream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let (up, upstream) = upstream_of(upstream_mr, upstream)?;
        let allocation_limit = required(allocation_limit, "allocation_limit")?;
        let limit = bytes_arg(allocation_limit, "allocation_limit")?;
        let limiting = RsLimiting::new(upstream, limit);
        Ok(adaptor_keeping(up, limiting, |limiting| {
            LimitingResourceAdaptor { limiting }
        }))
    }

    /// Bytes allocated through this adaptor now.
    fn get_allocated_bytes(&self) -> usize {
        self.limiting.allocated_bytes()
    }

    /// The limit in bytes.
    fn get_allocation_limit(&self) -> usize {
        self.limiting.allocation_limit()
    }
}

/// Logs every allocation and free to a CSV file in RMM's format (RMM's
/// `LoggingResourceAdaptor`): `log_file_name` (`$RMM_LOG_FILE` when None) with `.dev{N}` of the
/// current device inserted before the extension (`crate::adaptor::log_file_for_device`).
#[pyclass(module = "rrmm.mr", name = "LoggingResourceAdaptor", extends = UpstreamResourceAdaptor, frozen)]
pub(super) struct LoggingResourceAdaptor {
    pub(super) logging: Arc<RsLogging>,
}

/// A log file's name from Python: None, or a str, bytes or `os.PathLike` (`os.fsdecode`).
fn log_file_name_arg(py: Python<'_>, name: Option<&Bound<'_, PyAny>>) -> PyResult<Option<String>> {
    let Some(name) = name.filter(|n| !n.is_none()) else {
        return Ok(None);
    };
    let os = py.import("os")?;
    let is_path = name.is_instance_of::<pyo3::types::PyString>()
        || name.is_instance_of::<pyo3::types::PyBytes>()
        || name.is_instance(&os.getattr("PathLike")?)?;
    if !is_path {
        return Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "log_file_name must be a str, bytes or os.PathLike, not {}",
            name.get_type().name()?
        )));
    }
    Ok(Some(os.call_method1("fsdecode", (name,))?.extract()?))
}

/// `rrmm._logging.log_file_for_device`: RMM's allocation-log file name of `device`.
#[pyfunction]
#[pyo3(signature = (name, device))]
fn log_file_for_device(
    py: Python<'_>,
    name: Option<&Bound<'_, PyAny>>,
    device: usize,
) -> PyResult<String> {
    let name = log_file_name_arg(py, name)?;
    py_result(crate::adaptor::log_file_for_device(name.as_deref(), device))
}

#[pymethods]
impl LoggingResourceAdaptor {
    #[new]
    #[pyo3(signature = (upstream_mr=None, log_file_name=None, auto_flush=false, *, upstream=None))]
    fn new(
        py: Python<'_>,
        upstream_mr: Option<&Bound<'_, PyAny>>,
        log_file_name: Option<&Bound<'_, PyAny>>,
        auto_flush: bool,
        upstream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let (up, upstream) = upstream_of(upstream_mr, upstream)?;
        let name = log_file_name_arg(py, log_file_name)?;
        let path = py_result(crate::adaptor::log_file_for_device(
            name.as_deref(),
            crate::current_device_ordinal(),
        ))?;
        let logging = py_result(RsLogging::new(upstream, &path, auto_flush))?;
        Ok(adaptor_keeping(up, logging, |logging| {
            LoggingResourceAdaptor { logging }
        }))
    }

    /// Writes buffered rows to the file.
    fn flush(&self) -> PyResult<()> {
        py_result(self.logging.flush())
    }

    /// The log file's path.
    fn get_file_name(&self) -> String {
        self.logging.file_name().to_string()
    }
}

/// Counts bytes and allocations, with push/pop levels (RMM's `StatisticsResourceAdaptor`).
#[pyclass(module = "rrmm.mr", name = "StatisticsResourceAdaptor", extends = UpstreamResourceAdaptor, frozen)]
pub(super) struct StatisticsResourceAdaptor {
    pub(super) stats: Arc<RsStatisticsAdaptor>,
}

#[pymethods]
impl StatisticsResourceAdaptor {
    #[new]
    #[pyo3(signature = (upstream_mr=None, *, upstream=None))]
    fn new(
        upstream_mr: Option<&Bound<'_, PyAny>>,
        upstream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let (up, upstream) = upstream_of(upstream_mr, upstream)?;
        let stats = RsStatisticsAdaptor::new(upstream);
        Ok(adaptor_keeping(up, stats, |stats| {
            StatisticsResourceAdaptor { stats }
        }))
    }

    /// The counters of the top level, as `rrmm.statistics.Statistics`.
    #[getter]
    fn allocation_counts(&self) -> Statistics {
        self.stats.allocation_counts().into()
    }

    /// Starts a new level of counters; returns the counters before the push.
    fn push_counters(&self) -> Statistics {
        self.stats.push_counters().into()
    }

    /// Ends the top level, merging it into the level below; returns the popped counters
    /// (IndexError when only one level is left).
    fn pop_counters(&self) -> PyResult<Statistics> {
        Ok(py_result(self.stats.pop_counters())?.into())
    }
}

/// Tracks every outstanding allocation (RMM's `TrackingResourceAdaptor`).
#[pyclass(module = "rrmm.mr", name = "TrackingResourceAdaptor", extends = UpstreamResourceAdaptor, frozen)]
pub(super) struct TrackingResourceAdaptor {
    pub(super) tracking: Arc<RsTracking>,
}

#[pymethods]
impl TrackingResourceAdaptor {
    #[new]
    #[pyo3(signature = (upstream_mr=None, capture_stacks=false, *, upstream=None))]
    fn new(
        upstream_mr: Option<&Bound<'_, PyAny>>,
        capture_stacks: bool,
        upstream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let (up, upstream) = upstream_of(upstream_mr, upstream)?;
        let tracking = RsTracking::new(upstream, capture_stacks);
        Ok(adaptor_keeping(up, tracking, |tracking| {
            TrackingResourceAdaptor { tracking }
        }))
    }

    /// Bytes outstanding.
    fn get_allocated_bytes(&self) -> usize {
        self.tracking.allocated_bytes()
    }

    /// The outstanding allocations, one line each (with stacks when captured).
    fn get_outstanding_allocations_str(&self) -> String {
        self.tracking.outstanding_allocations_str()
    }

    /// Writes the outstanding allocations to the debug log.
    fn log_outstanding_allocations(&self) {
        self.tracking.log_outstanding_allocations()
    }
}

/// Calls `callback(nbytes)` when an allocation fails and retries while it returns True (RMM's
/// `FailureCallbackResourceAdaptor`).
#[pyclass(module = "rrmm.mr", name = "FailureCallbackResourceAdaptor", extends = UpstreamResourceAdaptor, frozen)]
pub(super) struct FailureCallbackResourceAdaptor {
    /// The callback.
    #[pyo3(get)]
    callback: Py<PyAny>,
}

#[pymethods]
impl FailureCallbackResourceAdaptor {
    #[new]
    #[pyo3(signature = (upstream_mr=None, callback=None, *, upstream=None))]
    fn new(
        upstream_mr: Option<&Bound<'_, PyAny>>,
        callback: Option<&Bound<'_, PyAny>>,
        upstream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let (up, upstream) = upstream_of(upstream_mr, upstream)?;
        let callback = required(callback, "callback")?;
        if !callback.is_callable() {
            return Err(PyTypeError::new_err("callback must be callable"));
        }
        let f = CallableRef::new(callback);
        let call = Box::new(move |bytes: usize| -> crate::Result<bool> {
            Python::attach(|py| {
                // The allocation fails with the callback's own exception, carried in the error.
                f.get(py, "callback")
                    .and_then(|f| f.call1((bytes,)))
                    .and_then(|r| r.is_truthy())
                    .map_err(|e| callback_error(py, e, bytes))
            })
        });
        let adaptor = Arc::new(RsFailureCallback::new(upstream, call));
        Ok(over_upstream(
            FailureCallbackResourceAdaptor {
                callback: callback.clone().unbind(),
            },
            up,
            adaptor,
        ))
    }

    /// The garbage collector's view of the callback this object holds (the Rust closure holds
    /// it weakly, see `callable_ref`).
    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        visit.call(&self.callback)
    }
}

/// rrmm: serves from `upstream_mr` and, when it is out of memory, from `alternate_mr` (default:
/// a new `ManagedMemoryResource`) instead of raising `MemoryError`; `counts()` says what went
/// where.
#[pyclass(module = "rrmm.mr", name = "FallbackResourceAdaptor", extends = UpstreamResourceAdaptor, frozen)]
pub(super) struct FallbackResourceAdaptor {
    pub(super) fallback: Arc<RsFallback>,
    /// The resource used when the upstream is out of memory.
    #[pyo3(get, name = "alternate_mr")]
    pub(super) alternate: Py<DeviceMemoryResource>,
}

#[pymethods]
impl FallbackResourceAdaptor {
    #[new]
    #[pyo3(signature = (upstream_mr=None, alternate_mr=None, *, upstream=None))]
    fn new(
        py: Python<'_>,
        upstream_mr: Option<&Bound<'_, PyAny>>,
        alternate_mr: Option<&Bound<'_, PyAny>>,
        upstream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let (up, upstream) = upstream_of(upstream_mr, upstream)?;
        let (alternate, alternate_rs) = match alternate_mr {
            Some(a) if !a.is_none() => upstream_arg(a)?,
            _ => {
                // RMM's default: managed memory (the class itself, not the Python package's name
                // for it: the bindings never call back up into `rrmm`).
                let managed = py
                    .get_type::<super::source_resources::ManagedMemoryResource>()
                    .call0()?;
                upstream_arg(&managed)?
            }
        };
        let fallback = RsFallback::new(upstream, alternate_rs);
        Ok(adaptor_keeping(up, fallback, |fallback| {
            FallbackResourceAdaptor {
                fallback,
                alternate,
            }
        }))
    }

    /// The garbage collector's view of the alternate this object holds.
    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        visit.call(&self.alternate)
    }

    /// What went where: allocations and bytes held now by the upstream and the alternate, the
    /// alternate's peak bytes, and how many allocations fell back or failed in both, ever.
    fn counts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        record_dict(py, &self.fallback.counts())
    }
}

/// Prefetches every allocation to the device on its stream (RMM's `PrefetchResourceAdaptor`).
#[pyclass(module = "rrmm.mr", name = "PrefetchResourceAdaptor", extends = UpstreamResourceAdaptor, frozen)]
pub(super) struct PrefetchResourceAdaptor;

#[pymethods]
impl PrefetchResourceAdaptor {
    #[new]
    #[pyo3(signature = (upstream_mr=None, *, upstream=None))]
    fn new(
        upstream_mr: Option<&Bound<'_, PyAny>>,
        upstream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let (up, upstream) = upstream_of(upstream_mr, upstream)?;
        Ok(over_upstream(
            PrefetchResourceAdaptor,
            up,
            Arc::new(RsPrefetch::new(upstream)),
        ))
    }
}

/// Aligns allocations of `alignment_threshold` bytes or more to `alignment` (RMM's
/// `AlignedResourceAdaptor`).
#[pyclass(module = "rrmm.mr", name = "AlignedResourceAdaptor", extends = UpstreamResourceAdaptor, frozen)]
pub(super) struct AlignedResourceAdaptor {
    aligned: Arc<RsAligned>,
}

#[pymethods]
impl AlignedResourceAdaptor {
    #[new]
    #[pyo3(signature = (upstream_mr=None, alignment=256, alignment_threshold=65536, *, upstream=None))]
    fn new(
        upstream_mr: Option<&Bound<'_, PyAny>>,
        alignment: usize,
        alignment_threshold: usize,
        upstream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let (up, upstream) = upstream_of(upstream_mr, upstream)?;
        let aligned = py_result(RsAligned::new(upstream, alignment, alignment_threshold))?;
        Ok(adaptor_keeping(up, aligned, |aligned| {
            AlignedResourceAdaptor { aligned }
        }))
    }

    /// The alignment in bytes.
    fn alignment(&self) -> usize {
        self.aligned.alignment()
    }

    /// The size from which allocations are aligned.
    fn alignment_threshold(&self) -> usize {
        self.aligned.alignment_threshold()
    }
}

crate::python::register_items! {
    classes: LimitingResourceAdaptor, FallbackResourceAdaptor, LoggingResourceAdaptor,
        StatisticsResourceAdaptor, TrackingResourceAdaptor, FailureCallbackResourceAdaptor,
        PrefetchResourceAdaptor, AlignedResourceAdaptor;
    functions: log_file_for_device;
}
