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

mod engine;
mod factory;
mod fit;
mod trace;

pub use engine::{
    replay, replay_with_progress, Progress, Repeat, ReplayOptions, ReplayReport, TimelinePoint,
    AUTO_MAX_REPEATS, AUTO_MIN_REPEATS, AUTO_MIN_TIME,
};
pub use factory::{
    build, build_resource, build_resource_sized, canonical_name, resource_names, BlockRounding,
    BuiltResource, ResourceEntry, ResourceOptions, DEFAULT_BINS, RESOURCES,
};
pub use fit::{fit, FitResult};
pub use trace::{Action, Trace, TraceEvent};

#[cfg(test)]
mod tests;
