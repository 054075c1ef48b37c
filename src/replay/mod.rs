//! Replay of RMM-format allocation logs against any resource: parse a log into a compact
//! [`Trace`], [`replay`] it on real or simulated memory, read the [`ReplayReport`].
//!
//! ```
//! use rrmm::replay::{replay, ReplayOptions, Trace};
//! use rrmm::{SharedResource, SimulatedMemoryResource};
//! use std::sync::Arc;
//!
//! let log = "Thread,Time,Action,Pointer,Size,Stream\n\
//!            1,10:00:00.000000,allocate,0x7f0000000000,1000,0\n\
//!            1,10:00:00.000010,free,0x7f0000000000,1000,0\n";
//! let trace = Trace::from_reader("example.csv", log.as_bytes(), false)?;
//! let mr: SharedResource = Arc::new(SimulatedMemoryResource::new(1 << 30));
//! let report = replay(&trace, &mr, ReplayOptions::default())?;
//! assert_eq!((report.events, report.peak_bytes_in_use), (2, 1000));
//! # Ok::<(), rrmm::Error>(())
//! ```

mod compare;
mod engine;
mod fit;
mod trace;

pub use crate::stack::{
    canonical_name, kind_names as resource_names, BlockRounding, BuiltStack as BuiltResource,
    StackOptions as ResourceOptions, DEFAULT_BINS,
};
pub use engine::{
    more_repetitions, replay, replay_with_progress, timings, HostPagesUsed, Progress, Repeat,
    ReplayOptions, ReplayReport, TimelinePoint, Timings, AUTO_MAX_REPEATS, AUTO_MIN_REPEATS,
    AUTO_MIN_TIME,
};

/// Builds the resource `name` for a replay: over a simulated device of `simulate` bytes when
/// given, else over the current CUDA device ([`crate::stack::build`]).
///
/// # Errors
/// As [`crate::stack::build`].
pub fn build(
    name: &str,
    simulate: Option<usize>,
    options: &ResourceOptions,
) -> crate::Result<BuiltResource> {
    crate::stack::build(name, crate::stack::Target::from_simulate(simulate), options)
}
pub use compare::{
    compare, compare_with_progress, fit_many, fit_many_with_progress, CompareSettings, FitRecord,
    ReplayRecord, TimelineColumns, PYTHON_DRIVER, RUST_DRIVER,
};
pub use fit::{fit, fit_with_progress, search_smallest, FitResult, FitTry, Search};
pub use trace::{Action, Trace, TraceEvent};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tiers_tests;
