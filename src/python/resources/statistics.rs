//! `rrmm.statistics.Statistics`: the counters of a `StatisticsResourceAdaptor`, as a frozen
//! value class of the extension (re-exported by `rrmm.statistics`).

use crate::adaptor::Statistics as RsStatistics;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// Counters of a `StatisticsResourceAdaptor`: bytes and allocations now, at the peak, and in
/// total. Immutable; compares and hashes by value.
#[pyclass(
    module = "rrmm.statistics",
    name = "Statistics",
    frozen,
    eq,
    hash,
    get_all
)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Statistics {
    /// Bytes allocated and not yet freed (negative in a level that freed what an outer level
    /// allocated).
    current_bytes: i64,
    /// Allocations not yet freed.
    current_count: i64,
    /// The most bytes allocated at once.
    peak_bytes: i64,
    /// The most allocations alive at once.
    peak_count: i64,
    /// All bytes ever allocated.
    total_bytes: i64,
    /// All allocations ever made.
    total_count: i64,
}

impl From<RsStatistics> for Statistics {
    fn from(s: RsStatistics) -> Self {
        Statistics {
            current_bytes: s.current_bytes,
            current_count: s.current_count,
            peak_bytes: s.peak_bytes,
            peak_count: s.peak_count,
            total_bytes: s.total_bytes,
            total_count: s.total_count,
        }
    }
}

#[pymethods]
impl Statistics {
    #[new]
    fn new(
        current_bytes: i64,
        current_count: i64,
        peak_bytes: i64,
        peak_count: i64,
        total_bytes: i64,
        total_count: i64,
    ) -> Self {
        Statistics {
            current_bytes,
            current_count,
            peak_bytes,
            peak_count,
            total_bytes,
            total_count,
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "Statistics(current_bytes={}, current_count={}, peak_bytes={}, peak_count={}, \
             total_bytes={}, total_count={})",
            self.current_bytes,
            self.current_count,
            self.peak_bytes,
            self.peak_count,
            self.total_bytes,
            self.total_count
        )
    }

    /// Pickles as the constructor call.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let s = slf.get();
        let args = (
            s.current_bytes,
            s.current_count,
            s.peak_bytes,
            s.peak_count,
            s.total_bytes,
            s.total_count,
        );
        (slf.get_type(), args).into_pyobject(slf.py())
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Statistics>()?;
    Ok(())
}
