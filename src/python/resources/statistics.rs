//! `rrmm.statistics.Statistics`: the counters of a `StatisticsResourceAdaptor`, as a frozen
//! value class of the extension (re-exported by `rrmm.statistics`).

use crate::adaptor::Statistics as RsStatistics;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// The `Statistics` class from its list of `i64` counters, written once: the struct (every
/// field readable from Python), its conversion from the Rust counters, the constructor (every
/// field, in order), `__repr__` (`Statistics(field=value, ...)`) and `__reduce__` (the
/// constructor call).
macro_rules! statistics_class {
    (
        $(#[doc = $class_doc:literal])*
        $class:ident { $($(#[doc = $doc:literal])* $field:ident),+ $(,)? }
    ) => {
        $(#[doc = $class_doc])*
        #[pyclass(
            module = "rrmm.statistics",
            name = "Statistics",
            frozen,
            eq,
            hash,
            get_all
        )]
        #[derive(Clone, Copy, PartialEq, Eq, Hash)]
        pub(super) struct $class {
            $($(#[doc = $doc])* $field: i64,)+
        }

        impl From<RsStatistics> for $class {
            fn from(s: RsStatistics) -> Self {
                $class { $($field: s.$field,)+ }
            }
        }

        #[pymethods]
        impl $class {
            #[new]
            fn new($($field: i64),+) -> Self {
                $class { $($field,)+ }
            }

            fn __repr__(&self) -> String {
                let fields = [$(format!(concat!(stringify!($field), "={}"), self.$field)),+];
                format!("Statistics({})", fields.join(", "))
            }

            /// Pickles as the constructor call.
            fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
                let s = slf.get();
                (slf.get_type(), ($(s.$field,)+)).into_pyobject(slf.py())
            }
        }
    };
}

statistics_class! {
    /// Counters of a `StatisticsResourceAdaptor`: bytes and allocations now, at the peak, and in
    /// total. Immutable; compares and hashes by value.
    Statistics {
        /// Bytes allocated and not yet freed (negative in a level that freed what an outer level
        /// allocated).
        current_bytes,
        /// Allocations not yet freed.
        current_count,
        /// The most bytes allocated at once.
        peak_bytes,
        /// The most allocations alive at once.
        peak_count,
        /// All bytes ever allocated.
        total_bytes,
        /// All allocations ever made.
        total_count,
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Statistics>()?;
    Ok(())
}
