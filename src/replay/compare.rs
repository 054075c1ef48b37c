//! Comparing resources on logs: every (log, resource) pair replayed on a fresh resource, one
//! flat [`ReplayRecord`] per pair (what `rrmm replay` prints and `--json` writes), and the
//! smallest device each fits on ([`fit_many`]).
//!
//! ```
//! use rrmm::replay::{compare, CompareSettings};
//!
//! let log = std::env::temp_dir().join(format!("rrmm-compare-doc-{}.csv", std::process::id()));
//! std::fs::write(&log, "Thread,Time,Action,Pointer,Size,Stream\n\
//!     1,10:00:00.000000,allocate,0x10,1000,0\n1,10:00:00.000010,free,0x10,1000,0\n")?;
//! let settings = CompareSettings { simulate: Some(1 << 30), ..CompareSettings::default() };
//! let records = compare(&[log.to_str().unwrap()], &["pool", "arena"], &settings)?;
//! assert_eq!(records.len(), 2);
//! assert_eq!(records[0].resource, "pool");
//! assert_eq!(records[0].driver, "rust");
//! assert_eq!(records[0].failed_allocations, Some(0));
//! # std::fs::remove_file(&log)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use super::{build, FitResult, ReplayOptions, ReplayReport, ResourceOptions, Trace};
use crate::error::Result;
use serde::Serialize;

/// [`ReplayRecord::driver`] and [`FitRecord::driver`] of the rows this engine produces.
pub const RUST_DRIVER: &str = "rust";

/// [`ReplayRecord::driver`] and [`FitRecord::driver`] of the rows whose allocator is written in
/// Python (PyTorch's, CuPy's, rrmm's through its Python API): replayed by this engine over a
/// resource of Python functions, every call through Python.
pub const PYTHON_DRIVER: &str = "python";

/// How a comparison runs.
#[derive(Clone, Debug, Default)]
pub struct CompareSettings {
    /// Bytes of a simulated device, or `None` for the current GPU.
    pub simulate: Option<usize>,
    /// The resources' options (pool sizes, bins, ...).
    pub options: ResourceOptions,
    /// The replays' options (repetitions, timeline points).
    pub replay: ReplayOptions,
    /// Skip malformed lines instead of failing.
    pub lenient: bool,
}

/// The sampled timeline of a replay, as columns.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TimelineColumns {
    /// Events replayed at each point.
    pub event: Vec<usize>,
    /// Bytes in use at each point.
    pub bytes_in_use: Vec<u128>,
    /// The resource's footprint at each point, where it reports one.
    pub footprint: Vec<Option<usize>>,
    /// Bytes beyond the simulated device at each point (managed memory in host memory).
    pub beyond_device: Vec<Option<usize>>,
}

/// One (log, resource) row: the log's own facts, then the replay's figures (all `None`, with
/// `error` set, when the resource could not be built or replayed). Its field names are the keys
/// of `rrmm replay --json` and of the dicts `rrmm._rrmm.replay_logs` returns.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ReplayRecord {
    /// The log's source (path).
    pub log: String,
    /// The resource's name (canonical).
    pub resource: String,
    /// What the replay called: [`RUST_DRIVER`] (a resource of this crate, directly) or
    /// [`PYTHON_DRIVER`] (an allocator written in Python: rows `rrmm replay` adds for PyTorch,
    /// CuPy and rrmm through its Python API; the same engine, every call through Python).
    pub driver: String,
    /// The resource's setup in words, where it was built.
    pub setup: Option<String>,
    /// Whether the row is the simulated device itself.
    pub simulated_device: bool,
    /// Events of the log.
    pub events: usize,
    /// Allocate events.
    pub allocations: usize,
    /// `allocate failure` rows (not replayed).
    pub logged_failures: usize,
    /// Lines the lenient parse skipped ...
    pub parse_warnings: usize,
    /// ... and why.
    pub warning_messages: Vec<String>,
    /// Threads and streams of the log.
    pub threads: usize,
    /// Distinct streams.
    pub streams: usize,
    /// Rows with a null pointer.
    pub null_rows: usize,
    /// The most bytes the log had live at once.
    pub log_peak_bytes: u128,
    /// Allocations the log never frees.
    pub log_unfreed_allocations: usize,
    /// The largest request of the log.
    pub log_largest_request: usize,
    /// Why there are no figures, where there are none.
    pub error: Option<String>,
    /// Median wall time of the timed repetitions, ns.
    pub total_ns: Option<u64>,
    /// Median time per event, ns.
    pub ns_per_event: Option<f64>,
    /// Fastest repetition per event, ns.
    pub ns_per_event_min: Option<f64>,
    /// Slowest repetition per event, ns.
    pub ns_per_event_max: Option<f64>,
    /// First quartile per event, ns.
    pub ns_per_event_p25: Option<f64>,
    /// Third quartile per event, ns.
    pub ns_per_event_p75: Option<f64>,
    /// Interquartile range / median (None with fewer than two repetitions).
    pub spread: Option<f64>,
    /// Timed repetitions.
    pub repeats: Option<usize>,
    /// Each repetition's wall time, ns.
    pub samples_ns: Option<Vec<u64>>,
    /// The most bytes in use at once.
    pub peak_bytes_in_use: Option<u128>,
    /// The largest footprint sampled.
    pub peak_footprint: Option<usize>,
    /// `peak_footprint / peak_bytes_in_use`.
    pub overhead: Option<f64>,
    /// Internal waste at the peak.
    pub internal_waste_at_peak: Option<u128>,
    /// Internal waste after the last event.
    pub internal_waste_at_end: Option<u128>,
    /// External fragmentation at the peak.
    pub fragmentation_at_peak: Option<f64>,
    /// External fragmentation after the last event.
    pub fragmentation_at_end: Option<f64>,
    /// Bytes held after the last event.
    pub footprint_at_end: Option<usize>,
    /// The most bytes beyond the simulated device at once (managed memory that would live in
    /// host memory), where the device has a host tier.
    pub peak_beyond_device: Option<usize>,
    /// Each tier's counts (bytes and allocations: current at the end, peak, total; requests
    /// it passed on), where the resource has tiers (`tiered`: device, peer GPU, host).
    pub tiers: Option<Vec<crate::adaptor::TierCounts>>,
    /// The host pages the resource took from the process's supply, where it took any.
    pub host_pages: Option<super::engine::HostPagesUsed>,
    /// What a sleep of the expandable pool would release after the last event: every mapped
    /// byte (the footprint then), where the resource is an expandable pool ...
    pub sleep_releases_at_end: Option<usize>,
    /// ... copying the live bytes to host memory first (the allocations live then); the rest
    /// (free pages) is released without a copy.
    pub sleep_copies_at_end: Option<u128>,
    /// What a sleep would release when the pool held the most (its peak footprint), copying at
    /// most the peak bytes in use.
    pub sleep_releases_at_peak: Option<usize>,
    /// Allocations that failed with out of memory.
    pub failed_allocations: Option<usize>,
    /// Bytes they asked for.
    pub failed_bytes: Option<u128>,
    /// Their event indices.
    pub failure_events: Option<Vec<usize>>,
    /// Allocations above the largest request the resource serves by design.
    pub unservable_allocations: Option<usize>,
    /// Allocations live after the last event.
    pub leaked_allocations: Option<usize>,
    /// Their bytes.
    pub leaked_bytes: Option<u128>,
    /// The sampled timeline.
    pub timeline: Option<TimelineColumns>,
}

impl ReplayRecord {
    /// The log's facts, with no figures yet (driven from Rust; a driver from elsewhere sets
    /// [`ReplayRecord::driver`] and its figures).
    pub fn of_log(trace: &Trace, resource: &str) -> Self {
        ReplayRecord {
            log: trace.source.clone(),
            resource: resource.to_string(),
            driver: RUST_DRIVER.to_string(),
            events: trace.events.len(),
            allocations: trace.allocations(),
            logged_failures: trace.logged_failures,
            parse_warnings: trace.warnings,
            warning_messages: trace.warning_messages.clone(),
            threads: trace.threads.len(),
            streams: trace.streams.len(),
            null_rows: trace.null_rows,
            log_peak_bytes: trace.peak_requested_bytes,
            log_unfreed_allocations: trace.unfreed_allocations,
            log_largest_request: trace.events.iter().map(|e| e.size).max().unwrap_or(0),
            ..ReplayRecord::default()
        }
    }

    /// What a sleep of the (expandable) pool would release and copy, from the report's figures.
    fn with_sleep(mut self, r: &ReplayReport) -> Self {
        self.sleep_releases_at_end = r.footprint_at_end.map(|f| f.held_bytes);
        self.sleep_copies_at_end = Some(r.leaked_bytes);
        self.sleep_releases_at_peak = r.peak_footprint;
        self
    }

    /// The replay's figures.
    pub fn with_report(mut self, r: &ReplayReport) -> Self {
        let t = r.timings;
        self.total_ns = Some(t.total_ns);
        self.ns_per_event = Some(t.ns_per_event);
        self.ns_per_event_min = Some(t.ns_per_event_min);
        self.ns_per_event_max = Some(t.ns_per_event_max);
        self.ns_per_event_p25 = Some(t.ns_per_event_p25);
        self.ns_per_event_p75 = Some(t.ns_per_event_p75);
        self.spread = t.spread;
        self.repeats = Some(r.repeats);
        self.samples_ns = Some(r.samples_ns.clone());
        self.peak_bytes_in_use = Some(r.peak_bytes_in_use);
        self.peak_footprint = r.peak_footprint;
        self.overhead = r.overhead;
        self.internal_waste_at_peak = Some(r.internal_waste_at_peak);
        self.internal_waste_at_end = Some(r.internal_waste_at_end);
        self.fragmentation_at_peak = r.fragmentation_at_peak;
        self.fragmentation_at_end = r.fragmentation_at_end;
        self.footprint_at_end = r.footprint_at_end.map(|f| f.held_bytes);
        self.peak_beyond_device = r.peak_beyond_device;
        self.tiers = r.tiers.clone();
        self.host_pages = r.host_pages;
        self.failed_allocations = Some(r.failed_allocations);
        self.failed_bytes = Some(r.failed_bytes);
        self.failure_events = Some(r.failure_events.clone());
        self.unservable_allocations = Some(r.unservable_allocations);
        self.leaked_allocations = Some(r.leaked_allocations);
        self.leaked_bytes = Some(r.leaked_bytes);
        self.timeline = Some(TimelineColumns {
            event: r.timeline.iter().map(|p| p.event).collect(),
            bytes_in_use: r.timeline.iter().map(|p| p.bytes_in_use).collect(),
            footprint: r.timeline.iter().map(|p| p.footprint).collect(),
            beyond_device: r.timeline.iter().map(|p| p.beyond_device).collect(),
        });
        self
    }
}

/// Replays every log against every resource (by name, [`crate::stack`]), in that order: a fresh
/// resource per (log, resource), kept across its repetitions and dropped before the next is
/// built. A resource that cannot be built or replayed is its own record, with `error` set.
///
/// # Errors
/// A log that cannot be read or parsed (naming file and line).
pub fn compare(
    logs: &[impl AsRef<str>],
    resources: &[impl AsRef<str>],
    settings: &CompareSettings,
) -> Result<Vec<ReplayRecord>> {
    compare_with_progress(logs, resources, settings, &mut |_| {})
}

/// [`compare`] with the replays' progress given to `progress`
/// ([`replay_with_progress`](super::replay_with_progress)).
///
/// # Errors
/// As [`compare`].
pub fn compare_with_progress(
    logs: &[impl AsRef<str>],
    resources: &[impl AsRef<str>],
    settings: &CompareSettings,
    progress: &mut dyn FnMut(super::Progress),
) -> Result<Vec<ReplayRecord>> {
    let mut out = Vec::with_capacity(logs.len() * resources.len());
    for log in logs {
        let trace = Trace::from_path(log.as_ref(), settings.lenient)?;
        for name in resources {
            let name = name.as_ref();
            let record = match build(name, settings.simulate, &settings.options) {
                Ok(built) => {
                    let mut record = ReplayRecord::of_log(&trace, &built.name);
                    record.setup = Some(built.setup.clone());
                    record.simulated_device = built.simulated_device;
                    let options = ReplayOptions {
                        rounding: Some(built.rounding.clone()),
                        largest_request: built.largest_request,
                        device: built.managed_device(),
                        ..settings.replay.clone()
                    };
                    let sleeps = built
                        .handles
                        .iter()
                        .any(|h| matches!(h, crate::stack::Handle::Expandable(_)));
                    match super::replay_with_progress(&trace, &built.resource, options, progress) {
                        Ok(report) if sleeps => record.with_report(&report).with_sleep(&report),
                        Ok(report) => record.with_report(&report),
                        Err(e) => ReplayRecord {
                            error: Some(e.to_string()),
                            ..record
                        },
                    }
                }
                Err(e) => ReplayRecord {
                    error: Some(format!("cannot be built: {e}")),
                    ..ReplayRecord::of_log(&trace, name)
                },
            };
            out.push(record);
        }
    }
    Ok(out)
}

/// What [`fit_many`] found for one (log, resource).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FitRecord {
    /// The log's source.
    pub log: String,
    /// The resource's name.
    pub resource: String,
    /// What ran the search: [`RUST_DRIVER`] (simulated devices) or [`PYTHON_DRIVER`]
    /// (`rrmm replay`'s PyTorch and CuPy rows: a memory limit on the GPU).
    pub driver: String,
    /// The smallest device found with no failed allocation (None: none up to 1 PiB).
    pub device_bytes: Option<usize>,
    /// The largest size tried that failed.
    pub failing_bytes: Option<usize>,
    /// The pool's initial size on the device found.
    pub initial_pool_size: Option<usize>,
    /// The pool's maximum on the device found.
    pub maximum_pool_size: Option<usize>,
    /// The arena's size on the device found.
    pub arena_size: Option<usize>,
    /// The resource's setup on the device found.
    pub setup: Option<String>,
    /// Replays the search ran.
    pub replays: Option<usize>,
    /// Why it fits nowhere, where it does not.
    pub reason: Option<String>,
}

/// For each log and resource, the smallest simulated device on which the log replays with no
/// failed allocation ([`fit`](super::fit)).
///
/// # Errors
/// A log that cannot be read or parsed.
pub fn fit_many(
    logs: &[impl AsRef<str>],
    resources: &[impl AsRef<str>],
    options: &ResourceOptions,
    lenient: bool,
) -> Result<Vec<FitRecord>> {
    fit_many_with_progress(logs, resources, options, lenient, &mut |_| {})
}

/// [`fit_many`], calling `progress` after every size a search tried.
///
/// # Errors
/// As [`fit_many`].
pub fn fit_many_with_progress(
    logs: &[impl AsRef<str>],
    resources: &[impl AsRef<str>],
    options: &ResourceOptions,
    lenient: bool,
    progress: &mut dyn FnMut(super::fit::FitTry),
) -> Result<Vec<FitRecord>> {
    let mut out = Vec::new();
    for log in logs {
        let trace = Trace::from_path(log.as_ref(), lenient)?;
        for name in resources {
            let name = crate::stack::canonical_name(name.as_ref());
            let record = match super::fit_with_progress(&trace, &name, options, progress) {
                Ok(f) => record_of_fit(&trace.source, &name, f),
                Err(e) => FitRecord {
                    log: trace.source.clone(),
                    resource: name.clone(),
                    driver: RUST_DRIVER.to_string(),
                    reason: Some(e.to_string()),
                    ..FitRecord::default()
                },
            };
            out.push(record);
        }
    }
    Ok(out)
}

fn record_of_fit(source: &str, name: &str, f: FitResult) -> FitRecord {
    FitRecord {
        log: source.to_string(),
        resource: name.to_string(),
        driver: RUST_DRIVER.to_string(),
        device_bytes: f.device_bytes,
        failing_bytes: Some(f.failing_bytes),
        initial_pool_size: f.pool_sizes.map(|p| p.0),
        maximum_pool_size: f.pool_sizes.and_then(|p| p.1),
        arena_size: f.arena_size,
        setup: Some(f.setup),
        replays: Some(f.replays),
        reason: f.reason,
    }
}
